"""Checkpoint files on disk: atomic bundle writes, the `checkpoint` state file, deletion.

A checkpoint is TensorFlow's tensor bundle: `<prefix>.index` plus
`<prefix>.data-NNNNN-of-MMMMM`. The index is what makes a prefix a checkpoint, so a save
writes everything under a temporary prefix, renames the data files, renames the index
last, and only then points the state file at it. A save that dies at any step leaves
the earlier checkpoints and the state file as they were.
"""
import os
import re
import uuid

import tensorflow as tf

from mesh_tf.errors import CheckpointError

STATE_FILENAME = "checkpoint"
_SINGLE_SHARD = ".data-00000-of-00001"
_DATA_SUFFIX = re.compile(r"\.data-\d{5}-of-\d{5}$")


def _is_local(path):
  return "://" not in path


def _replace(src, dst):
  """Renames src to dst, replacing dst (atomic for local files)."""
  if _is_local(src):
    os.replace(src, dst)
  else:
    tf.io.gfile.rename(src, dst, overwrite=True)


def _remove_quietly(path):
  try:
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
  except (OSError, tf.errors.OpError):
    pass


def index_file(prefix):
  """The index file of a checkpoint prefix."""
  return prefix + ".index"


def data_files(prefix):
  """The data files of a checkpoint prefix that exist, sorted."""
  return sorted(tf.io.gfile.glob(prefix + ".data-?????-of-?????"))


def exists(prefix):
  """Whether a checkpoint (its index file) exists at prefix."""
  return tf.io.gfile.exists(index_file(prefix))


def write_bundle(prefix, names, tensors):
  """Writes tensors under names at prefix, atomically; returns prefix.

  Everything is first written under a hidden temporary prefix in the same directory;
  on any failure the temporary files are removed and no index appears at prefix.
  """
  directory = os.path.dirname(prefix) or "."
  tf.io.gfile.makedirs(directory)
  tmp = os.path.join(directory, ".%s.tmp-%s" % (os.path.basename(prefix),
                                                uuid.uuid4().hex))
  moved_data = False
  try:
    try:
      tf.raw_ops.SaveV2(prefix=tmp, tensor_names=list(names),
                        shape_and_slices=[""] * len(names), tensors=list(tensors))
    except tf.errors.OpError as e:
      raise CheckpointError("could not write checkpoint %s: %s" % (prefix, e.message),
                            file=prefix) from e
    # An older checkpoint under the same name stops being one before its data changes.
    _remove_quietly(index_file(prefix))
    for old in data_files(prefix):
      tf.io.gfile.remove(old)
    _replace(tmp + _SINGLE_SHARD, prefix + _SINGLE_SHARD)
    moved_data = True
    _replace(index_file(tmp), index_file(prefix))
    moved_data = False
  finally:
    _remove_quietly(tmp + _SINGLE_SHARD)
    _remove_quietly(index_file(tmp))
    if moved_data:
      _remove_quietly(prefix + _SINGLE_SHARD)
  return prefix


def delete_checkpoint(prefix):
  """Removes a checkpoint's files: the index first, so it is never half there."""
  _remove_quietly(index_file(prefix))
  for path in data_files(prefix):
    _remove_quietly(path)
  _remove_quietly(prefix + ".meta")


# ---- the state file (`checkpoint`), as written by TF's savers ----
def read_state(directory):
  """The checkpoint prefixes listed in directory's state file, oldest first.

  Paths are absolute (relative ones are taken relative to directory). The latest
  checkpoint is last. Returns [] if there is no readable state file.
  """
  state = tf.train.get_checkpoint_state(directory)
  if state is None or not state.model_checkpoint_path:
    return []
  paths = [p for p in state.all_model_checkpoint_paths
           if p != state.model_checkpoint_path]
  return paths + [state.model_checkpoint_path]


def _quote(text):
  return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_state(directory, prefixes):
  """Atomically points directory's state file at prefixes (the last is the latest)."""
  if not prefixes:
    raise CheckpointError("no checkpoint to record in the state file of %s" % directory,
                          file=os.path.join(directory, STATE_FILENAME))

  head = directory.rstrip("/") + "/"

  def relative(p):
    rest = p[len(head):] if p.startswith(head) else None
    return rest if rest and "/" not in rest else p
  lines = ["model_checkpoint_path: %s" % _quote(relative(prefixes[-1]))]
  lines += ["all_model_checkpoint_paths: %s" % _quote(relative(p)) for p in prefixes]
  path = os.path.join(directory, STATE_FILENAME)
  tmp = os.path.join(directory, ".%s.tmp-%s" % (STATE_FILENAME, uuid.uuid4().hex))
  try:
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write("\n".join(lines) + "\n")
    _replace(tmp, path)
  finally:
    _remove_quietly(tmp)


def record_latest(prefix):
  """Adds prefix as the latest checkpoint in its directory's state file."""
  directory = os.path.dirname(prefix) or "."
  kept = [p for p in read_state(directory) if p != prefix and exists(p)]
  write_state(directory, kept + [prefix])


# ---- finding a checkpoint ----
def resolve_prefix(path):
  """The checkpoint prefix that path names.

  path may be a prefix, its `.index` or a data file, or a directory (its latest
  checkpoint). Raises CheckpointError naming the file when there is none.
  """
  path = os.fspath(path)
  if path.endswith(".index"):
    path = path[:-len(".index")]
  path = _DATA_SUFFIX.sub("", path)
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      state = os.path.join(path, STATE_FILENAME)
      raise CheckpointError(
          "no checkpoint in directory %s: its state file %s is missing, unreadable, or "
          "names no checkpoint whose .index file exists" % (path, state), file=state)
    return latest
  if not exists(path):
    raise CheckpointError("checkpoint %s not found: %s does not exist"
                          % (path, index_file(path)), file=index_file(path))
  return path


def step_from_prefix(prefix):
  """The N of a prefix ending in -N, else None."""
  match = re.search(r"-(\d+)$", prefix)
  return int(match.group(1)) if match else None
