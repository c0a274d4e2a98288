"""`save_checkpoint` and `restore_checkpoint`: full-shape values under mtf names.

Each variable is written whole in its master dtype, under the name the original library
gave its master variable, as a name-based TensorFlow checkpoint: the original's
checkpoints restore by name, and one written on one mesh and layout restores on any other.
"""
import collections
import difflib
import os

import numpy as np
import tensorflow as tf

from mesh_tf.checkpoint import discovery, files
from mesh_tf.checkpoint.entries import collect_entries
from mesh_tf.checkpoint.record import RECORD_KEY, record_tensor
from mesh_tf.errors import CheckpointError

DEFAULT_BASENAME = "model.ckpt"
GLOBAL_STEP = "global_step"

# What TF's checkpoint reader raises for unreadable files (it maps TF status codes to
# Python exceptions: OUT_OF_RANGE becomes IndexError, DATA_LOSS an OpError, ...).
_READ_ERRORS = (tf.errors.OpError, ValueError, RuntimeError, IndexError, KeyError, OSError)
# Reads of a directory's latest checkpoint that find it pruned re-resolve this often.
_READ_ATTEMPTS = 5

RestoreResult = collections.namedtuple("RestoreResult",
                                       ["path", "names", "missing", "global_step"])
RestoreResult.__doc__ = """What restore_checkpoint did: the prefix read, the keys restored
(sorted), the keys missing from the checkpoint (only with allow_missing), and its integer
`global_step` value (or None)."""


def _check_eager(what):
  if not tf.executing_eagerly():
    raise CheckpointError("%s runs eagerly; call it outside tf.function" % what)


def _checkpoint_prefix(path):
  path = os.fspath(path)
  if path.endswith("/") or tf.io.gfile.isdir(path):
    return os.path.join(path, DEFAULT_BASENAME)
  return path


def write_checkpoint(prefix, entries, global_step=None, record=None):
  """Writes entries (from collect_entries) at prefix[-global_step]; returns the prefix.

  Does not touch the state file. A global_step is also stored as the int64 scalar
  `global_step` unless entries have one; a record (text) as the entry record.RECORD_KEY.
  """
  _check_eager("saving a checkpoint")
  values = {name: e.read() for name, e in entries.items()}
  if record is not None:
    values[RECORD_KEY] = record_tensor(record)
  if global_step is not None:
    step = int(np.asarray(global_step))
    prefix = "%s-%d" % (prefix, step)
    values.setdefault(GLOBAL_STEP, tf.constant(step, tf.int64))
  names = sorted(values)
  return files.write_bundle(prefix, names, [values[n] for n in names])


def save_checkpoint(path, source, extra_variables=None, global_step=None):
  """Saves every variable of source at full shape under its mtf name; returns the prefix.

  Args:
    path: checkpoint prefix (e.g. "/ckpts/model.ckpt"), or a directory (then
      "<dir>/model.ckpt").
    source: a mtf.Lowering, a MeshImpl, a dict name -> laid-out variable, or a list.
    extra_variables: optional dict name -> tf.Variable saved under those names.
    global_step: optional int; appends "-<step>" to the prefix (as tf.train.Saver does)
      and stores `global_step` unless extra_variables has one.

  The write is atomic; the directory's `checkpoint` state file then names it the latest.
  """
  prefix = _checkpoint_prefix(path)
  entries = collect_entries(source, extra_variables)
  prefix = write_checkpoint(prefix, entries, global_step=global_step)
  files.record_latest(prefix)
  return prefix


def _open_reader(prefix):
  try:
    return tf.train.load_checkpoint(prefix)
  except _READ_ERRORS as e:
    raise CheckpointError("cannot read checkpoint index %s: %s"
                          % (files.index_file(prefix), getattr(e, "message", e)),
                          file=files.index_file(prefix)) from e


def _read_value(reader, name, prefix):
  try:
    return reader.get_tensor(name)
  except _READ_ERRORS as e:
    data = files.data_files(prefix)
    where = data[0] if len(data) == 1 else prefix + ".data-*"
    raise CheckpointError("cannot read variable %r from checkpoint data file %s (corrupt "
                          "or truncated?): %s" % (name, where, getattr(e, "message", e)),
                          tensor=name, file=where) from e


def _kind(dtype):
  dtype = tf.as_dtype(dtype)
  for kind in ("is_floating", "is_integer", "is_complex", "is_bool"):
    if getattr(dtype, kind):
      return kind
  return dtype.name


def _missing_error(missing, available, prefix):
  name = missing[0]
  others = ""
  if len(missing) > 1:
    shown = ", ".join(repr(m) for m in missing[1:4])
    others = " (nor %d more: %s%s)" % (len(missing) - 1, shown,
                                       ", ..." if len(missing) > 4 else "")
  close = difflib.get_close_matches(name, available, n=3, cutoff=0.5)
  closest = "; closest: %s" % ", ".join(repr(c) for c in close) if close else ""
  return CheckpointError(
      "checkpoint %s has no variable %r%s; it has %d keys, e.g. %s%s"
      % (prefix, name, others, len(available), ", ".join(repr(a) for a in available[:5]),
         closest),
      tensor=name, file=files.index_file(prefix),
      hint="pass allow_missing=True to keep the current values of missing variables")


def _check_entry(entry, shapes, dtypes, prefix):
  """Raises CheckpointError if the stored key does not fit the variable."""
  stored_shape, stored_dtype = list(shapes[entry.name]), tf.as_dtype(dtypes[entry.name])
  if stored_shape != entry.shape:
    raise CheckpointError(
        "variable %r has shape %s in checkpoint %s but shape %s here; the full (unsliced) "
        "shape must match" % (entry.name, stored_shape, files.index_file(prefix),
                              entry.shape),
        tensor=entry.name, file=files.index_file(prefix))
  if _kind(stored_dtype) != _kind(entry.dtype):
    raise CheckpointError(
        "variable %r is %s in checkpoint %s but %s here; only casts between dtypes of one "
        "kind (float to float, int to int) are made" % (
            entry.name, stored_dtype.name, files.index_file(prefix), entry.dtype.name),
        tensor=entry.name, file=files.index_file(prefix))


def _read_entries(prefix, entries, allow_missing):
  """(present entries, their values, missing names, global step) read from prefix."""
  reader = _open_reader(prefix)
  shapes = reader.get_variable_to_shape_map()
  dtypes = reader.get_variable_to_dtype_map()
  missing = [name for name in entries if name not in shapes]
  present = [e for name, e in entries.items() if name in shapes]
  for entry in present:  # a model of another size: name the first differing variable
    _check_entry(entry, shapes, dtypes, prefix)
  if missing and not allow_missing:
    raise _missing_error(missing, sorted(shapes), prefix)
  values = [_read_value(reader, e.name, prefix) for e in present]
  step = None
  if (GLOBAL_STEP in shapes and not shapes[GLOBAL_STEP]
      and tf.as_dtype(dtypes[GLOBAL_STEP]).is_integer):
    step = int(_read_value(reader, GLOBAL_STEP, prefix))
  return present, values, missing, step


def _deleted_error(prefix, directory):
  if directory is None:
    return CheckpointError(
        "checkpoint %s was deleted while it was read: %s no longer exists (pruned by a "
        "trainer keeping fewer checkpoints?); name a checkpoint that is kept, or the "
        "directory to read its newest" % (prefix, files.index_file(prefix)),
        file=files.index_file(prefix))
  return CheckpointError(
      "checkpoint %s was deleted while it was read, and so were %d newer ones in a row "
      "(is a trainer pruning %s faster than it can be read?)"
      % (files.index_file(prefix), _READ_ATTEMPTS - 1, directory),
      file=files.index_file(prefix))


def restore_checkpoint(path, target, extra_variables=None, allow_missing=False):
  """Sets target's variables from the full-shape values stored under their names.

  Works whatever mesh and layout the checkpoint was saved with. Stored values are cast
  to each variable's master dtype, then to its slice dtype. Keys of the checkpoint that
  target lacks (e.g. optimizer slots) are ignored. Nothing is assigned unless every
  variable checks out and reads cleanly.

  Args:
    path: a checkpoint prefix, or a directory (its latest checkpoint; should that be
      pruned while it is read, the newest complete one then, saying so in one line)
      or a discovery.Latest.
    target: a mtf.Lowering, a MeshImpl, a dict name -> laid-out variable, or a list.
    extra_variables: optional dict name -> tf.Variable restored from those keys.
    allow_missing: if True, variables absent from the checkpoint keep their values.

  Returns:
    a RestoreResult(path, names, missing, global_step).

  Raises:
    CheckpointError: no checkpoint there, a corrupt file, a missing variable, or a
      variable whose stored shape differs (naming the variable, both shapes and file).
  """
  _check_eager("restore_checkpoint")
  directory = discovery.latest_of(path)  # None: path names one checkpoint
  prefix = discovery.resolve_prefix(path)
  entries = collect_entries(target, extra_variables)
  for attempt in range(_READ_ATTEMPTS):
    try:
      present, values, missing, step = _read_entries(prefix, entries, allow_missing)
      break
    except CheckpointError as e:
      if files.exists(prefix):  # pruning removes the index first
        raise  # still there: the error is about its contents
      if directory is None or attempt == _READ_ATTEMPTS - 1:
        raise _deleted_error(prefix, directory) from e
      newer = discovery.resolve_prefix(directory, report=None)
      print("checkpoint %s was deleted while it was read (pruned by a trainer?); reading "
            "%s, now the newest complete checkpoint of %s"
            % (os.path.basename(prefix), os.path.basename(newer), directory), flush=True)
      prefix = newer
  for entry, value in zip(present, values):
    entry.write(tf.convert_to_tensor(value))
  return RestoreResult(prefix, [e.name for e in present], missing, step)
