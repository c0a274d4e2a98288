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
_STATE_LINE = re.compile(r'^\s*(model_checkpoint_path|all_model_checkpoint_paths|'
                         r'all_model_checkpoint_timestamps|last_preserved_timestamp)'
                         r'\s*:\s*(.*?)\s*$')


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
  on any failure the temporary files are removed and no index appears at prefix. An
  existing checkpoint at prefix is never written over: that raises CheckpointError.
  """
  if exists(prefix):
    raise CheckpointError(
        "checkpoint %s already exists; refusing to write over it (delete it yourself, or "
        "save under another name or step)" % prefix, file=index_file(prefix))
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
    for old in data_files(prefix):  # shards of a save that died before its index
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
def _unquote(text):
  if len(text) < 2 or text[0] != '"' or text[-1] != '"':
    raise ValueError("not a quoted string: %r" % text)
  out, i, body = [], 0, text[1:-1]
  escapes = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'"}
  while i < len(body):
    if body[i] == "\\" and i + 1 < len(body) and body[i + 1] in escapes:
      out.append(escapes[body[i + 1]])
      i += 2
    else:
      out.append(body[i])
      i += 1
  return "".join(out)


def read_state_file(directory):
  """(prefixes oldest first with the latest last, problem): problem is None for a
  well-formed state file, else why it cannot be used ("missing", "empty", ...)."""
  path = os.path.join(directory, STATE_FILENAME)
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      raw = f.read()
  except tf.errors.NotFoundError:
    return [], "missing"
  except (tf.errors.OpError, OSError) as e:
    return [], "unreadable (%s)" % getattr(e, "message", e)
  if not raw.strip():
    return [], "empty"
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError:
    return [], "not text (binary content)"
  if "\x00" in text:
    return [], "not text (binary content)"
  latest, listed = None, []
  for number, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    match = _STATE_LINE.match(line)
    try:
      if not match:
        raise ValueError(line)
      if match.group(1) == "model_checkpoint_path":
        latest = _unquote(match.group(2))
      elif match.group(1) == "all_model_checkpoint_paths":
        listed.append(_unquote(match.group(2)))
    except ValueError:
      return [], "garbled (line %d: %r)" % (number, line[:60])
  if not latest:
    return [], "garbled (no model_checkpoint_path)"

  def absolute(p):
    return p if os.path.isabs(p) or "://" in p else os.path.join(directory, p)
  prefixes = [absolute(p) for p in listed if p != latest] + [absolute(latest)]
  return prefixes, None


def read_state(directory):
  """The checkpoint prefixes listed in directory's state file, oldest first.

  Paths are absolute (relative ones are taken relative to directory). The latest
  checkpoint is last. Returns [] if there is no usable state file.
  """
  return read_state_file(directory)[0]


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
  except (OSError, tf.errors.OpError) as e:
    raise CheckpointError("could not write the checkpoint state file %s: %s (the "
                          "previous state file and every checkpoint are unchanged)"
                          % (path, getattr(e, "message", None) or e), file=path) from e
  finally:
    _remove_quietly(tmp)


def record_latest(prefix):
  """Adds prefix as the latest checkpoint in its directory's state file."""
  directory = os.path.dirname(prefix) or "."
  kept = [p for p in read_state(directory) if p != prefix and exists(p)]
  write_state(directory, kept + [prefix])


def step_from_prefix(prefix):
  """The N of a prefix ending in -N, else None."""
  match = re.search(r"-(\d+)$", prefix)
  return int(match.group(1)) if match else None
