"""A checkpoint's record: one scalar string entry saved beside the variables.

A trainer may store what the weights mean beyond their shapes (its vocabulary, its
model's hyperparameters) as text under RECORD_KEY, so the record is written, read and
pruned with the checkpoint itself. Checkpoints without it (older ones, the original
library's) read as having no record; restoring ignores the entry.
"""
import tensorflow as tf

from mesh_tf.checkpoint import discovery

RECORD_KEY = "mesh_tf_run_record"


def record_tensor(text):
  """The tf.string scalar stored under RECORD_KEY."""
  return tf.constant(str(text), tf.string)


def read_record(path):
  """(prefix, record text or None) of the checkpoint at path (a prefix or a directory:
  its latest checkpoint). Raises CheckpointError where there is no readable checkpoint."""
  from mesh_tf.checkpoint import save_restore  # pylint: disable=g-import-not-at-top
  prefix = discovery.resolve_prefix(path, report=None)  # restoring reports notes
  reader = save_restore._open_reader(prefix)  # pylint: disable=protected-access
  shapes = reader.get_variable_to_shape_map()
  if RECORD_KEY not in shapes or shapes[RECORD_KEY]:
    return prefix, None
  if tf.as_dtype(reader.get_variable_to_dtype_map()[RECORD_KEY]) != tf.string:
    return prefix, None
  value = save_restore._read_value(reader, RECORD_KEY, prefix)  # pylint: disable=protected-access
  return prefix, value.decode("utf-8") if isinstance(value, bytes) else str(value)
