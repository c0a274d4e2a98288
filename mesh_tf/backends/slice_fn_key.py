"""When two calls of slice functions make the same TF ops: a hashable key for a call.

Lowering builds a new closure per mtf op, so the same computation on same-shaped slices
comes back as different function objects. `call_key` looks through them: two calls get
equal keys when their functions have the same code and closure values (plain data by
value; tensors, module-level functions and other objects by identity) and their
arguments the same dtypes and slice shapes (tensors) or values. As with tf.function, a
call answered from an earlier trace does not run the function again (its Python side
effects happen at the first call only).
"""
import math

import numpy as np
import tensorflow as tf

from mesh_tf.shapes.shape import Dimension, Shape

_PLAIN = (type(None), bool, int, complex, str, bytes, tf.DType, Dimension)
_MAX_ARRAY_BYTES = 1 << 12
_MAX_DEPTH = 4


class _Identity:
  """Hashes and compares by identity, keeping the object alive while the key lives (so
  its id is not reused by another object)."""
  __slots__ = ("obj",)

  def __init__(self, obj):
    self.obj = obj

  def __hash__(self):
    return id(self.obj)

  def __eq__(self, other):
    return isinstance(other, _Identity) and other.obj is self.obj


def value_key(value, depth=0):
  """A hashable key equal for values a slice function cannot tell apart, or None."""
  if isinstance(value, float):  # 0.0 == -0.0, but t * 0.0 and t * -0.0 differ in sign
    return (float, value, math.copysign(1.0, value))
  if isinstance(value, _PLAIN):
    return (type(value), value)
  if isinstance(value, Shape):
    return (Shape, tuple(value))
  if isinstance(value, (tf.Tensor, tf.Variable)):
    return _Identity(value)
  if isinstance(value, np.ndarray):
    if value.nbytes > _MAX_ARRAY_BYTES or value.dtype == object:
      return None
    return (np.ndarray, value.dtype.str, value.shape, value.tobytes())
  if isinstance(value, np.generic):
    return (type(value), value_key(value.item(), depth))
  if depth >= _MAX_DEPTH:
    return _Identity(value) if callable(value) else None
  if isinstance(value, (tuple, list)):
    parts = tuple(value_key(v, depth + 1) for v in value)
    return None if any(p is None for p in parts) else (type(value), parts)
  if isinstance(value, dict):
    return None
  if hasattr(value, "__code__"):
    # a function made once, at import (tf.math.multiply): the object itself is its key
    if "<locals>" not in getattr(value, "__qualname__", "<locals>"):
      return _Identity(value)
    return function_key(value, depth + 1)
  if hasattr(value, "__func__") and hasattr(value, "__self__"):  # a bound method
    func = function_key(value.__func__, depth + 1)
    return None if func is None else ("method", func, _Identity(value.__self__))
  return _Identity(value)


def function_key(fn, depth=0):
  """Key of a Python function: its code with its closure and default values; the
  function itself where those have no key (it stands only for itself then)."""
  cells = fn.__closure__ or ()
  try:
    parts = [value_key(c.cell_contents, depth) for c in cells]
  except ValueError:  # an empty cell (a name assigned after the function was made)
    return _Identity(fn)
  parts.append(value_key(fn.__defaults__, depth))
  parts.append(value_key(tuple(sorted((fn.__kwdefaults__ or {}).items())), depth))
  if any(p is None for p in parts):
    return _Identity(fn)
  return ("function", fn.__code__, tuple(parts))


def call_key(fn, args, sliced_positions, num_leading_axes):
  """Key of fn(*args) where args at sliced_positions are tensors with num_leading_axes
  axes before the slice: their dtype and slice shape count, other args by value_key.
  None when some part has no key."""
  parts = [value_key(fn)]
  for i, a in enumerate(args):
    if i in sliced_positions:
      if a.shape.rank is None:
        return None
      parts.append((a.dtype, tuple(a.shape.as_list()[num_leading_axes:])))
    else:
      parts.append(value_key(a))
  return None if any(p is None for p in parts) else tuple(parts)


def graph_cache(graph, name):
  """A dict named `name` kept on the graph itself, so it lives as long as graph (a table
  keyed weakly by graph would never drop an entry: its values hold the graph)."""
  caches = getattr(graph, "_mesh_tf_slice_caches", None)
  if caches is None:
    caches = {}
    setattr(graph, "_mesh_tf_slice_caches", caches)
  return caches.setdefault(name, {})
