"""Test session set-up: 8 virtual CPU devices, configured once before TF initializes."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_VIRTUAL_DEVICES = 8


def _configure_virtual_cpus():
  cpus = tf.config.list_physical_devices("CPU")
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_VIRTUAL_DEVICES)
  except RuntimeError:
    # TF already initialized (e.g. by a plugin); the check below reports the count.
    pass


_configure_virtual_cpus()
assert len(tf.config.list_logical_devices("CPU")) == NUM_VIRTUAL_DEVICES, (
    "tests need %d virtual CPU devices" % NUM_VIRTUAL_DEVICES)
