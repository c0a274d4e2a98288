"""Each process of a multi-client run reads only its own share of the batch.

With processors laid task-major over the processes, the replicas of one process hold
one box of every input (`MultiClientMeshImpl.process_share`): e.g. on mesh
batch:2;model:4 over two processes, task t's replicas hold rows [t*B/2, (t+1)*B/2) of
a [B, ...] batch, replicated over `model`. The process builds just that box and gives
it to its replicas (`import_tf_tensor` accepts the share); nothing ships the whole
batch.
"""
import tensorflow as tf

from mesh_tf.errors import LayoutError


def batch_rows(mesh_impl, batch_shape):
  """(begin, end): the rows of a [batch, ...] input this process's replicas read."""
  shape = mesh_impl_shape(mesh_impl, batch_shape)
  begin, size = mesh_impl.process_share(shape)
  if list(size[1:]) != shape.to_integer_list[1:]:
    raise LayoutError("input %s is split beyond its first (batch) dimension; a process "
                      "share of rows cannot express that" % shape.to_string)
  return begin[0], begin[0] + size[0]


def mesh_impl_shape(mesh_impl, batch_shape):
  """The mtf Shape of an input with dims batch_shape (a Shape, or a list of sizes
  named batch, length, ...)."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  if isinstance(batch_shape, (list, tuple)) and all(isinstance(s, int)
                                                    for s in batch_shape):
    names = ["batch", "length"] + ["d%d" % i for i in range(2, len(batch_shape))]
    return mtf.Shape([mtf.Dimension(n, s) for n, s in zip(names, batch_shape)])
  del mesh_impl
  return mtf.convert_to_shape(batch_shape)


def share_of_dataset(dataset, global_batch, rows):
  """The batches of this process from a dataset of single examples: global batch k is
  examples [k*global_batch, (k+1)*global_batch); the process keeps rows [begin, end)
  of each and batches them. Examples outside the share are dropped before batching."""
  begin, end = rows
  if not 0 <= begin < end <= global_batch:
    raise LayoutError("rows [%d, %d) are not a share of a batch of %d"
                      % (begin, end, global_batch))
  kept = dataset.enumerate().filter(
      lambda i, _: tf.logical_and(i % global_batch >= begin, i % global_batch < end))
  return kept.map(lambda _, x: x).batch(end - begin, drop_remainder=True)
