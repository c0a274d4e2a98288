"""Claiming a model_dir for training: its lock (a second trainer is refused at once),
then removal of what killed saves and prunes left behind (hidden temporaries, data
shards without an index). Checkpoints themselves are never touched here."""
import contextlib
import os

import tensorflow as tf

from mesh_tf.checkpoint import discovery
from mesh_tf.checkpoint.lock import DirectoryLock
from mesh_tf.errors import CheckpointError


@contextlib.contextmanager
def claimed_model_dir(model_dir):
  """Holds model_dir's lock for the context, after removing leftovers of killed runs."""
  lock = DirectoryLock(model_dir).acquire()
  try:
    removed = remove_leftovers(model_dir)
    if removed:
      print("removed %d file(s) left by an interrupted run in %s: %s"
            % (len(removed), model_dir, ", ".join(removed)), flush=True)
    yield lock
  finally:
    lock.release()


def remove_leftovers(model_dir):
  """Removes discovery.leftovers(model_dir); returns the removed file names."""
  removed = []
  try:
    for path in discovery.leftovers(model_dir):
      tf.io.gfile.remove(path)
      removed.append(os.path.basename(path))
  except (OSError, tf.errors.OpError) as e:
    raise CheckpointError("cannot clean model_dir %s: %s" % (model_dir, e),
                          file=model_dir) from e
  return removed
