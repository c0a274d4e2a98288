"""Sampling from logits along a named dim: `sample_with_temperature` (Gumbel-max)."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Tensor
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops.indexing import argmax
from mesh_tf.ops.random import random_gumbel
from mesh_tf.shapes import convert_to_dimension


def sample_with_temperature(logits, dim, temperature=1.0, name=None):
  """int32 samples along dim (removed) from softmax(logits / temperature), Gumbel-max.

  temperature: a Python number (0.0: argmax, no noise) or an mtf Tensor broadcast against
  logits. The noise (random.random_gumbel) does not depend on the layout."""
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
    gumbel = random_gumbel(logits.mesh, logits.shape,
                           name=(name or "sample_with_temperature") + "/noise")
    # x * 1.0 is x: the usual temperature costs no op on each processor
    unit = not isinstance(temperature, Tensor) and temperature == 1.0
    logits += gumbel if unit else gumbel * temperature
  return argmax(logits, dim)
