"""Reduction names ("SUM", "MAX", "MIN"; any letter case) and their TF functions."""
import tensorflow as tf

from mesh_tf.errors import LayoutError

# name: (two-argument TF function, TF reduce function, merge_op of TF's collective ops).
# MEAN is an op-level reduction only (mtf.reduce_mean).
_TABLE = {
    "SUM": (tf.add, tf.reduce_sum, "Add"),
    "MAX": (tf.maximum, tf.reduce_max, "Max"),
    "MIN": (tf.minimum, tf.reduce_min, "Min"),
}
COLLECTIVE_REDUCTIONS = tuple(_TABLE)
OP_REDUCTIONS = COLLECTIVE_REDUCTIONS + ("MEAN",)
_BINARY = {name: row[0] for name, row in _TABLE.items()}
_REDUCE = {name: row[1] for name, row in _TABLE.items()}
_REDUCE_WITH_MEAN = dict(_REDUCE, MEAN=tf.reduce_mean)
_MERGE_OP = {name: row[2] for name, row in _TABLE.items()}


def canonical_reduction(reduction_fn_string):
  """The upper-case form of a reduction name ("sum" -> "SUM"); other values unchanged
  (unknown names are left for the caller to reject)."""
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
  """The TF reduce function for "SUM", "MAX" or "MIN" (tf.reduce_sum, ...)."""
  return _lookup(_REDUCE, reduction_fn_string)


def op_reduction_fn(reduction_fn_string):
  """The TF reduce function of an mtf reduction op: "SUM", "MAX", "MIN" or "MEAN"."""
  return _lookup(_REDUCE_WITH_MEAN, reduction_fn_string)


def collective_merge_op(reduction_fn_string):
  """The merge_op name of TF's collective reduce ops ("Add", "Max", "Min")."""
  return _lookup(_MERGE_OP, reduction_fn_string)


def check_collective_reduction(reduction_fn_string):
  """The canonical name; raises LayoutError unless it is SUM, MAX or MIN."""
  _lookup(_REDUCE, reduction_fn_string)
  return canonical_reduction(reduction_fn_string)
