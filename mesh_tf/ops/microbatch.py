"""`serialize_training_step`: gradient accumulation over microbatches in a while_loop."""
import tensorflow as tf

from mesh_tf.autodiff.gradients import gradients
from mesh_tf.errors import ShapeError
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops.control_flow import while_loop
from mesh_tf.ops.creation import constant
from mesh_tf.ops.einsum import einsum
from mesh_tf.ops.indexing import gather, one_hot
from mesh_tf.ops.reshape import replace_dimensions
from mesh_tf.shapes import Dimension, convert_to_dimension


def serialize_training_step(features, model_fn, batch_dim, num_splits):
  """Runs model_fn on num_splits microbatches in turn, summing gradients and outputs.

  Microbatch m holds the rows b of batch_dim (features: a dict of mtf Tensors with it)
  with b % num_splits == m; model_fn(features of one microbatch) returns a dict of
  Tensors with a "loss". Returns (grads, outputs): the loss's gradients summed over
  microbatches, one per graph.trainable_variables, and model_fn's outputs, each summed
  over microbatches or, if it has the (smaller) batch dim, reassembled to the full batch.
  """
  batch_dim = convert_to_dimension(batch_dim)
  if not features:
    raise ShapeError("serialize_training_step needs at least one feature")
  for k, v in features.items():
    if batch_dim not in v.shape.dims:
      raise ShapeError("serialize_training_step: feature %r (%s %s) lacks batch dim %s" % (
          k, v.name, v.shape, batch_dim), tensor=v.name, dim=batch_dim.name)
  if num_splits < 1 or batch_dim.size % num_splits:
    raise ShapeError("serialize_training_step: num_splits=%r does not divide %s" % (
        num_splits, batch_dim), dim=batch_dim.name)
  first = next(iter(features.values()))
  mesh, graph = first.mesh, first.graph
  micro_dim = Dimension("microbatch", num_splits)
  small_batch = Dimension(batch_dim.name, batch_dim.size // num_splits)
  keys = []

  def select(t, index):
    return gather(replace_dimensions(t, batch_dim, [small_batch, micro_dim]), index,
                  micro_dim)

  def body_fn(index):
    outputs = model_fn({k: select(v, index) for k, v in features.items()})
    if "loss" not in outputs:
      raise ShapeError("serialize_training_step: model_fn's outputs %s have no 'loss'"
                       % sorted(outputs))
    variables = graph.trainable_variables
    grads = gradients([outputs["loss"]], [v.outputs[0] for v in variables])
    missing = [v.name for v, g in zip(variables, grads) if g is None]
    if missing:
      raise ShapeError("serialize_training_step: the loss does not depend on trainable "
                       "variables %s" % missing, tensor=missing[0])
    keys.extend(outputs)
    accumulated = []
    for t in outputs.values():
      if small_batch in t.shape.dims:  # the sum over iterations assembles the batch
        t = einsum([t, one_hot(index, micro_dim, dtype=t.dtype)],
                   output_shape=replace_dimensions(t.shape, small_batch,
                                                   [small_batch, micro_dim]))
        t = replace_dimensions(t, [small_batch, micro_dim], batch_dim)
      accumulated.append(t)
    return [index + 1] + accumulated + grads

  results = while_loop(lambda index: ew.less(index, num_splits), body_fn,
                       [constant(mesh, 0, dtype=tf.int32)], has_accumulators=True)
  outputs = dict(zip(keys, results[1:1 + len(keys)]))
  return results[1 + len(keys):], outputs
