"""Sampling from logits along a named dim: `sample_with_temperature` (Gumbel-max)."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Tensor
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops.indexing import argmax
from mesh_tf.ops.random import random_uniform
from mesh_tf.shapes import convert_to_dimension

# Uniform noise is drawn from [_TINY, 1) so -log(-log(u)) stays finite at both ends.
_TINY = 1e-9


def sample_with_temperature(logits, dim, temperature=1.0, name=None):
  """int32 samples along dim (removed) from softmax(logits / temperature), Gumbel-max.

  temperature: a Python number (0.0: argmax, no noise) or an mtf Tensor broadcast against
  logits. The noise (mtf.random_uniform) does not depend on the layout."""
  dim = convert_to_dimension(dim)
  if dim not in logits.shape.dims:
    raise ShapeError("sample_with_temperature: dim %s is not a dim of %s %s" % (
        dim, logits.name, logits.shape), tensor=logits.name, dim=dim.name)
  if not isinstance(temperature, Tensor) and temperature < 0:
    raise ShapeError("sample_with_temperature of %s: temperature %r is negative" % (
        logits.name, temperature), tensor=logits.name)
  if isinstance(temperature, Tensor) or temperature != 0.0:
    # float32 noise: -log(-log(u)) is too coarse in bfloat16.
    logits = ew.cast(logits, tf.float32)
    if isinstance(temperature, Tensor):
      temperature = ew.cast(temperature, tf.float32)
    uniform = random_uniform(logits.mesh, logits.shape, minval=_TINY, maxval=1.0,
                             name=(name or "sample_with_temperature") + "/noise")
    gumbel = -ew.log(-ew.log(uniform))
    logits += gumbel * temperature
  return argmax(logits, dim)
