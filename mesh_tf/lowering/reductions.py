"""Reduction names ("SUM", "MAX", "MIN"; any letter case) and their TF functions."""
import tensorflow as tf

from mesh_tf.errors import LayoutError

_BINARY = {"SUM": tf.add, "MAX": tf.maximum, "MIN": tf.minimum}
_REDUCE = {"SUM": tf.reduce_sum, "MAX": tf.reduce_max, "MIN": tf.reduce_min}


def canonical_reduction(reduction_fn_string):
  """The upper-case form of a reduction name ("sum" -> "SUM"); other values unchanged.

  Every op and backend that takes a reduction name passes it through here first, so
  "sum", "Sum" and "SUM" mean the same. Unknown names are left for the caller to reject.
  """
  if isinstance(reduction_fn_string, str):
    return reduction_fn_string.upper()
  return reduction_fn_string


def _lookup(table, reduction_fn_string):
  try:
    return table[canonical_reduction(reduction_fn_string)]
  except (KeyError, TypeError):
    raise LayoutError("unknown reduction %r; use one of %s (any case)"
                      % (reduction_fn_string, sorted(table))) from None


def binary_reduction_fn(reduction_fn_string):
  """The two-argument TF function for "SUM", "MAX" or "MIN" (tf.add, tf.maximum, ...)."""
  return _lookup(_BINARY, reduction_fn_string)


def reduction_fn(reduction_fn_string):
  """The TF reduce function for "SUM", "MAX" or "MIN" (tf.reduce_sum, ...), as in the
  original."""
  return _lookup(_REDUCE, reduction_fn_string)
