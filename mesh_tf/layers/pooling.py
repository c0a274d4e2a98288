"""Pooling layers: non-overlapping max or average pooling (strides equal to ksize)."""
from mesh_tf.ops.pooling import PoolOperation


def _pool(x, ksize, fn_string, name):
  if all(k == 1 for k in ksize):
    return x
  return PoolOperation(x, list(ksize), list(ksize), fn_string, name=name).outputs[0]


def max_pool2d(x, ksize=(2, 2), name="max_pool2d"):
  """Max over ksize windows of the h, w dims of x [batch..., h, w, channels]."""
  return _pool(x, ksize, "MAX_2D", name)


def avg_pool2d(x, ksize=(2, 2), name="avg_pool2d"):
  """Mean over ksize windows of the h, w dims of x [batch..., h, w, channels]."""
  return _pool(x, ksize, "AVG_2D", name)


def max_pool3d(x, ksize=(2, 2, 2), name="max_pool3d"):
  """Max over ksize windows of the d, h, w dims of x [batch..., d, h, w, channels]."""
  return _pool(x, ksize, "MAX_3D", name)


def avg_pool3d(x, ksize=(2, 2, 2), name="avg_pool3d"):
  """Mean over ksize windows of the d, h, w dims of x [batch..., d, h, w, channels]."""
  return _pool(x, ksize, "AVG_3D", name)
