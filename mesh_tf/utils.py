"""Small helpers for running mesh_tf programs on one machine."""
import tensorflow as tf

from mesh_tf.errors import LayoutError


def configure_virtual_cpus(n):
  """Splits the host CPU into n logical devices and returns their names ("/cpu:i").

  TensorFlow fixes its devices when it initializes, so call this before any op runs.
  Raises LayoutError if TF was already initialized with a different device count.
  """
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
