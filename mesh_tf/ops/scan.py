"""log_cumsum_exp: like cumsum (indexing.py), a scan against a triangular mask between
the dim and a copy of it, so it works on any layout (O(n^2) in the dim's size)."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops.indexing import mtf_range
from mesh_tf.ops.reduce import reduce_logsumexp
from mesh_tf.ops.reshape import reshape, transpose
from mesh_tf.shapes import Dimension, convert_to_dimension


def log_cumsum_exp(x, dim, reverse=False, name=None):
  """log(cumsum(exp(x))) along dim (tf.math.cumulative_logsumexp): each position is a
  logsumexp over those up to it (from it to the end if reverse), so nothing underflows."""
  dim = convert_to_dimension(dim)
  if dim not in x.shape.dims:
    raise ShapeError("log_cumsum_exp: dim %s is not a dim of %s %s" % (dim, x.name, x.shape),
                     tensor=x.name, dim=dim.name)
  if not x.dtype.is_floating:
    raise ShapeError("log_cumsum_exp: %s has dtype %s; it needs floats" % (
        x.name, x.dtype.name), tensor=x.name)
  target = Dimension(dim.name + "_scan_target", dim.size)
  included = (ew.greater_equal if reverse else ew.less_equal)(
      mtf_range(x.mesh, dim, tf.int32), mtf_range(x.mesh, target, tf.int32))
  masked = ew.where(included, x, float("-inf"))
  out = reduce_logsumexp(masked, dim)
  renamed = x.shape.rename_dimension(dim.name, target.name)
  if out.shape != renamed:
    out = transpose(out, renamed)
  return reshape(out, x.shape, name=name or "log_cumsum_exp")
