"""Each process of a multi-client run reads only its own share of the batch.

With processors laid task-major over the processes, the replicas of one process hold
one box of every input (`MultiClientMeshImpl.process_share`), e.g. rows [t*B/2,
(t+1)*B/2) of a [B, ...] batch for task t of two on mesh batch:2;model:4. The process
builds just that box and gives it to its replicas; nothing ships the whole batch.
"""
import tensorflow as tf

from mesh_tf.errors import LayoutError
from mesh_tf.shapes import convert_to_shape


def batch_rows(mesh_impl, batch_shape):
  """(begin, end): the rows of an input of mtf shape batch_shape ([batch, ...], e.g.
  "batch:8;length:64") that this process's replicas read."""
  shape = convert_to_shape(batch_shape)
  begin, size = mesh_impl.process_share(shape)
  if list(size[1:]) != shape.to_integer_list[1:]:
    raise LayoutError("input %s is split beyond its first (batch) dimension; a process "
                      "share of rows cannot express that" % shape.to_string)
  return begin[0], begin[0] + size[0]


def share_of_dataset(dataset, global_batch, rows, skip_batches=0):
  """The batches of this process from a dataset of single examples: global batch k is
  examples [k*global_batch, (k+1)*global_batch); the process keeps rows [begin, end)
  of each and batches them. Examples outside the share are dropped before batching;
  the first skip_batches global batches (a resumed run's) are skipped whole."""
  begin, end = rows
  if not 0 <= begin < end <= global_batch:
    raise LayoutError("rows [%d, %d) are not a share of a batch of %d"
                      % (begin, end, global_batch))
  if skip_batches:
    dataset = dataset.skip(skip_batches * global_batch)
  kept = dataset.enumerate().filter(
      lambda i, _: tf.logical_and(i % global_batch >= begin, i % global_batch < end))
  return kept.map(lambda _, x: x).batch(end - begin, drop_remainder=True)
