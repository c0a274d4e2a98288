"""The reductions collectives accept ("SUM", "MAX", "MIN"), as TF functions."""
import functools

import tensorflow as tf

from mesh_tf.errors import LayoutError

_BINARY = {"SUM": tf.add, "MAX": tf.maximum, "MIN": tf.minimum}


def binary_reduction_fn(reduction_fn_string):
  """The two-argument TF function for "SUM", "MAX" or "MIN"."""
  try:
    return _BINARY[reduction_fn_string]
  except KeyError:
    raise LayoutError("unknown reduction %r; use one of %s"
                      % (reduction_fn_string, sorted(_BINARY))) from None


def reduction_fn(reduction_fn_string):
  """The TF function reducing a list of tensors for "SUM", "MAX" or "MIN"."""
  if reduction_fn_string == "SUM":
    return tf.add_n
  return functools.partial(functools.reduce, binary_reduction_fn(reduction_fn_string))
