"""Learned relative-position attention biases (the T5 bucketing of distances).

A relative position (memory position minus query position) falls into one of
num_buckets buckets: small distances get a bucket each, larger ones share buckets whose
width grows logarithmically up to max_distance. With bidirectional buckets, half of
them are for memory before the query and half for memory after it.
"""
import math

import tensorflow as tf

import mesh_tf as mtf


def relative_position_bucket(relative_position, bidirectional=True, num_buckets=32,
                             max_distance=128):
  """int32 bucket index of each relative position (memory minus query position).

  Args:
    relative_position: int32 mtf Tensor.
    bidirectional: separate buckets for memory after the query; otherwise every
      later position shares bucket 0 with distance 0.
    num_buckets: number of buckets in all.
    max_distance: distances at or beyond it share the last bucket of their side.

  Returns:
    int32 Tensor shaped like relative_position, values in [0, num_buckets).
  """
  distance = -relative_position  # > 0 for memory before the query
  offset = None
  if bidirectional:
    num_buckets //= 2
    offset = mtf.cast(mtf.less(distance, 0), tf.int32) * num_buckets
    distance = mtf.abs(distance)
  else:
    distance = mtf.maximum(distance, 0)
  max_exact = num_buckets // 2
  # log of at least max_exact: the log branch is only taken there, and log(0) is -inf.
  ratio = mtf.cast(mtf.maximum(distance, max_exact), tf.float32) / float(max_exact)
  log_bucket = max_exact + mtf.cast(
      mtf.log(ratio) / math.log(max_distance / max_exact) * (num_buckets - max_exact),
      tf.int32)
  log_bucket = mtf.minimum(log_bucket, num_buckets - 1)
  bucket = mtf.where(mtf.less(distance, max_exact), distance, log_bucket)
  return bucket if offset is None else bucket + offset


def relative_attention_bias_variable(mesh, heads_dims, num_buckets, variable_dtype):
  """The learned bias table "relative_attention_bias" [heads..., buckets]."""
  buckets_dim = mtf.Dimension("buckets", num_buckets)
  return mtf.get_variable(mesh, "relative_attention_bias",
                          mtf.Shape(list(heads_dims) + [buckets_dim]),
                          initializer=tf.random_normal_initializer(stddev=1.0),
                          dtype=variable_dtype)


def relative_position_bias(table, relative_position, bidirectional, max_distance=128):
  """Looks up table [heads..., buckets] at the bucket of each relative position.

  Returns float [heads..., dims of relative_position...].
  """
  buckets_dim = table.shape.dims[-1]
  buckets = relative_position_bucket(relative_position, bidirectional=bidirectional,
                                     num_buckets=buckets_dim.size,
                                     max_distance=max_distance)
  out = mtf.Shape(table.shape.dims[:-1] + relative_position.shape.dims)
  return mtf.gather(table, buckets, buckets_dim, output_shape=out)
