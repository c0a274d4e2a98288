"""Embedding lookups: a [vocab, output] weight matrix and a gather."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.ops import indexing
from mesh_tf.ops.variables import get_variable
from mesh_tf.shapes import Shape


def embedding_weights(mesh, vocab_dim, output_dim, variable_dtype, name="embedding",
                      ensemble_dim=None, initializer=None):
  """The variable `name` of shape [*ensemble_dim, vocab_dim, output_dim].

  ensemble_dim may be None, one Dimension or a list of Dimensions (all lead the shape). The
  default initializer is TF1's unit normal, `tf.compat.v1.random_normal_initializer()`,
  looked up when the variable is made (so a patched one is honoured).
  """
  if initializer is None:
    initializer = tf.compat.v1.random_normal_initializer()
  if not ensemble_dim:
    leading = []
  elif isinstance(ensemble_dim, list):  # (a Dimension is itself a tuple)
    leading = list(ensemble_dim)
  else:
    leading = [ensemble_dim]
  return get_variable(mesh, name, Shape(leading + [vocab_dim, output_dim]),
                      dtype=variable_dtype, initializer=initializer)


def embedding(indices, vocab_dim, output_dim, variable_dtype, name="embedding"):
  """Rows of a new embedding matrix at indices: shape indices.shape + [output_dim]."""
  if vocab_dim in indices.shape.dims or output_dim in indices.shape.dims:
    raise ShapeError("embedding %r: indices %s %s already have dim %s or %s" % (
        name, indices.name, indices.shape, vocab_dim, output_dim), op=name,
                     tensor=indices.name)
  if indices.dtype.is_floating:
    raise ShapeError("embedding %r: indices %s must be integers, not %s" % (
        name, indices.name, indices.dtype.name), op=name, tensor=indices.name)
  weights = embedding_weights(indices.mesh, vocab_dim, output_dim, variable_dtype, name)
  return indexing.gather(weights, indices, vocab_dim)
