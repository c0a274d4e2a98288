"""`mtf.utils`: small helpers -- virtual CPUs, variable placement, host-side summaries."""
import contextlib

import tensorflow as tf

from mesh_tf import cpu_threads
from mesh_tf.errors import LayoutError


def configure_virtual_cpus(n, size_thread_pools=True):
  """Splits the host CPU into n logical devices and returns their names ("/cpu:i").

  TensorFlow fixes its devices when it initializes, so call this before any op runs.
  Raises LayoutError if TF was already initialized with a different device count.
  With size_thread_pools, n > 1 devices share the cores: each op gets cores // n
  threads (at least 1), unless the user sized TF's pools (mesh_tf.cpu_threads).
  """
  if size_thread_pools and n > 1:
    cpu_threads.apply(cpu_threads.pool_sizes(cpu_threads.host_cores(), n))
  cpus = tf.config.list_physical_devices("CPU")
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)
  except RuntimeError:
    pass  # already initialized: the check below tells whether the count is right
  have = len(tf.config.list_logical_devices("CPU"))
  if have != n:
    raise LayoutError("cannot make %d virtual CPU devices: TensorFlow already runs with "
                      "%d (set the count before any TF op runs)" % (n, have))
  return ["/cpu:%d" % i for i in range(n)]


@contextlib.contextmanager
def outside_all_rewrites():
  """A context in which new ops depend on nothing already pending and sit outside any
  enclosing control-flow construct (TF's `control_dependencies(None)`)."""
  with tf.control_dependencies(None):
    yield


def _num_bytes(var):
  """Bytes of a variable: an mtf Variable, a tf.Variable, or a TF1 variable op."""
  if isinstance(var, tf.Operation):
    shape = tf.TensorShape(var.get_attr("shape"))
    dtype = tf.as_dtype(var.get_attr("dtype"))
    return shape.num_elements() * dtype.size
  shape, dtype = var.shape, tf.as_dtype(getattr(var, "master_dtype", var.dtype))
  size = shape.size if hasattr(shape, "size") and not callable(shape.size) else (
      tf.TensorShape(shape).num_elements())
  return size * dtype.size


class BalancedVariablePlacer:
  """Places each variable on the device that holds the fewest bytes so far.

  Args:
    devices: device names, e.g. a PlacementMeshImpl's `devices`.
    init_usage: optional starting bytes per device (default all 0).
  """

  _VARIABLE_OP_TYPES = ("Variable", "VariableV2", "VarHandleOp")

  def __init__(self, devices, init_usage=None):
    self._devices = list(devices)
    if not self._devices:
      raise LayoutError("BalancedVariablePlacer needs at least one device")
    if init_usage is None:
      init_usage = [0] * len(self._devices)
    if len(init_usage) != len(self._devices):
      raise LayoutError("BalancedVariablePlacer: %d init_usage entries for %d devices"
                        % (len(init_usage), len(self._devices)))
    self._usage = list(init_usage)

  @property
  def usage(self):
    """Bytes placed on each device so far, in the order of `devices`."""
    return list(self._usage)

  def device_function(self, var):
    """The least-loaded device for var (an mtf Variable, a tf.Variable or a TF1 variable
    op; ties go to the first), charging var's bytes to it. As a TF device function, ops
    that are not variables keep their own device."""
    if isinstance(var, tf.Operation) and var.type not in self._VARIABLE_OP_TYPES:
      return var.device
    i = min(range(len(self._devices)), key=lambda k: (self._usage[k], k))
    self._usage[i] += _num_bytes(var)
    return self._devices[i]


def remove_summaries():
  """Forgets the scalar summaries lowered so far in the current TF graph."""
  from mesh_tf.ops import summary  # pylint: disable=g-import-not-at-top
  summary.clear_lowered_summaries()


_WRITERS = {}


def _summary_writer(model_dir):
  """One summary writer per directory, created eagerly, shared by every trace."""
  if model_dir not in _WRITERS:
    with tf.init_scope():
      _WRITERS[model_dir] = tf.summary.create_file_writer(model_dir)
  return _WRITERS[model_dir]


def create_host_call(model_dir):
  """(host_call_fn, tensors) that write this graph's lowered scalar summaries, or None
  when none was lowered. `host_call_fn(*tensors)` writes each as a scalar at the global
  step (`mtf.optimize.get_global_step()`) to an event file under model_dir.
  """
  from mesh_tf.ops import summary  # pylint: disable=g-import-not-at-top
  from mesh_tf.optimize import get_global_step  # pylint: disable=g-import-not-at-top
  recorded = list(summary.lowered_summaries())
  if not recorded:
    return None
  tags = [tag for tag, _ in recorded]
  step = tf.reshape(tf.cast(tf.convert_to_tensor(get_global_step()), tf.int64), [1])
  tensors = [step] + [tf.reshape(tf.cast(v, tf.float32), [1]) for _, v in recorded]

  def host_call_fn(global_step, *values):
    writer = _summary_writer(model_dir)
    with outside_all_rewrites(), writer.as_default():
      ops = [summary.write_scalar(tag, v[0], step=global_step[0])
             for tag, v in zip(tags, values)]
      writer.flush()
    return ops
  return host_call_fn, tensors


def topology_rank(topology):
  """The number of dims of a TPU topology's mesh (a tf.tpu.experimental.Topology, its
  serialized bytes, or the mesh shape itself)."""
  if isinstance(topology, (bytes, str)):
    topology = tf.tpu.experimental.Topology(serialized=topology)
  mesh_shape = getattr(topology, "mesh_shape", topology)
  return len(list(mesh_shape))
