"""Two helpers of the original's public API that are not ops: `parallel` (call a function
once per device) and `verify_no_new_dims` (a shape check)."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.shapes import convert_to_shape


def parallel(devices, fn, *args, **kwargs):
  """[fn(args[0][i], ..., **{k: v[i]}) under tf.device(devices[i]) for each i]: every
  argument is a list with one entry per device."""
  if not isinstance(devices, list):
    raise ShapeError("parallel: devices must be a list, got %r" % (devices,))
  for what, x in [("argument %d" % i, a) for i, a in enumerate(args)] + [
      ("keyword argument %r" % k, v) for k, v in kwargs.items()]:
    if not isinstance(x, list) or len(x) != len(devices):
      raise ShapeError("parallel: %s must be a list with one entry per device (%d), "
                       "got %r" % (what, len(devices), x))
  results = []
  for i, device in enumerate(devices):
    with tf.device(device):
      results.append(fn(*[a[i] for a in args], **{k: v[i] for k, v in kwargs.items()}))
  return results


def verify_no_new_dims(input_shapes, output_shape):
  """Raises ShapeError if output_shape has a dim that no input shape has."""
  known = {d for s in input_shapes for d in convert_to_shape(s).dims}
  output_shape = convert_to_shape(output_shape)
  new = [d for d in output_shape.dims if d not in known]
  if new:
    raise ShapeError("output shape %s has dims %s found in no input shape (%s)" % (
        output_shape, [str(d) for d in new], [str(convert_to_shape(s)) for s in input_shapes]),
                     dim=new[0].name)
