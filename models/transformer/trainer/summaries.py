"""TensorBoard scalars of a run, written with the core `tf.summary.write` and the
"scalars" plugin metadata, so training needs no TensorBoard installed."""
import os

import tensorflow as tf
from tensorflow.core.framework import summary_pb2
from tensorflow.core.util import event_pb2

_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


class ScalarWriter:
  """Writes named scalars at a step to event files in `directory`."""

  def __init__(self, directory):
    tf.io.gfile.makedirs(directory)
    self.directory = directory
    self._writer = tf.summary.create_file_writer(directory)

  def write(self, step, scalars):
    """Writes {name: float} at step and flushes (so a kill loses nothing written)."""
    with self._writer.as_default():
      for name, value in sorted(scalars.items()):
        tf.summary.write(name, tf.constant(float(value), tf.float32), step=int(step),
                         metadata=_SCALAR_METADATA)
    self._writer.flush()

  def close(self):
    """Flushes and closes the event file."""
    self._writer.close()


def read_scalars(directory):
  """{tag: [(step, value), ...]} from every event file under directory (for tests)."""
  result = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(directory, "events.out.tfevents.*"))):
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      for value in event.summary.value:
        number = tf.make_ndarray(value.tensor) if value.HasField("tensor") else (
            value.simple_value)
        result.setdefault(value.tag, []).append((event.step, float(number)))
  return result
