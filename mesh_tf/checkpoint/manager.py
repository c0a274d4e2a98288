"""`CheckpointManager`: numbered checkpoints in one directory, keeping the last few."""
import os

import numpy as np
import tensorflow as tf

from mesh_tf.checkpoint import discovery, files
from mesh_tf.checkpoint.entries import collect_entries
from mesh_tf.checkpoint.save_restore import (DEFAULT_BASENAME, GLOBAL_STEP,
                                             restore_checkpoint, write_checkpoint)
from mesh_tf.errors import CheckpointError, NonFiniteError


def check_finite(entries, prefix):
  """Raises NonFiniteError naming the first floating-point entry holding NaN or Inf."""
  for name in sorted(entries):
    entry = entries[name]
    if not entry.dtype.is_floating:
      continue
    finite = tf.math.is_finite(entry.read())
    if not bool(tf.reduce_all(finite)):
      size = int(tf.size(finite))
      bad = size - int(tf.math.count_nonzero(finite))
      raise NonFiniteError(
          "not writing checkpoint %s: variable %r holds %d NaN/Inf value(s) of %d"
          % (prefix, name, bad, size), tensor=name, file=prefix)


class CheckpointManager:
  """Saves `<directory>/<basename>-<step>` checkpoints and keeps the newest max_to_keep.

  The directory's `checkpoint` state file lists the kept checkpoints in TF's format. A
  manager made on an existing directory picks up its complete checkpoints by
  `discovery.find_checkpoints`; `note` says how they differ from the state file, and
  `repair_state()` rewrites it. A save never writes over an existing checkpoint, and old
  checkpoints are pruned only after a new one is written.

  Args:
    directory: where checkpoints go (created on the first save).
    source: what to save and restore: a mtf.Lowering, a MeshImpl, a dict name ->
      laid-out variable, or a list of these.
    max_to_keep: how many checkpoints to keep (None keeps all).
    checkpoint_basename: file name before "-<step>".
    extra_variables: optional dict name -> tf.Variable saved alongside (e.g.
      "global_step", which save() then uses when no step is given).
    require_finite: if True, save() refuses (NonFiniteError) to write a checkpoint in
      which a floating-point variable holds NaN or Inf.
    record: optional text saved in every checkpoint as the entry record.RECORD_KEY
      (e.g. vocabulary, hyperparameters); record.read_record reads it back.
  """

  def __init__(self, directory, source, max_to_keep=5, checkpoint_basename=DEFAULT_BASENAME,
               extra_variables=None, require_finite=False, record=None):
    if max_to_keep is not None and max_to_keep < 1:
      raise CheckpointError("max_to_keep must be at least 1 (or None), got %r"
                            % (max_to_keep,))
    self._directory = os.fspath(directory).rstrip("/") or "/"
    self._source = source
    self._extra = dict(extra_variables or {})
    self._max_to_keep = max_to_keep
    self._prefix = os.path.join(self._directory, checkpoint_basename)
    self._require_finite = require_finite
    self._record = record
    self._basename = checkpoint_basename
    found = discovery.find_checkpoints(self._directory, checkpoint_basename)
    self._checkpoints = found.checkpoints
    self._state_ok = found.state_ok
    self.note = found.note

  def repair_state(self):
    """Rewrites the state file to list the checkpoints found, if it did not already;
    returns whether it wrote."""
    if self._state_ok or not self._checkpoints:
      return False
    files.write_state(self._directory, self._checkpoints)
    self._state_ok = True
    return True

  @property
  def directory(self):
    return self._directory

  @property
  def checkpoint_prefix(self):
    """The path before "-<step>" of this manager's checkpoints."""
    return self._prefix

  @property
  def checkpoints(self):
    """Prefixes of the kept checkpoints, oldest first."""
    return list(self._checkpoints)

  @property
  def latest_checkpoint(self):
    """Prefix of the newest checkpoint, or None."""
    return self._checkpoints[-1] if self._checkpoints else None

  def save(self, step=None):
    """Writes checkpoint `<basename>-<step>` atomically, prunes old ones; returns it.

    step defaults to the value of extra_variables["global_step"].
    """
    if step is None:
      if GLOBAL_STEP not in self._extra:
        raise CheckpointError("CheckpointManager.save needs a step (or a %r extra "
                              "variable)" % GLOBAL_STEP)
      step = self._extra[GLOBAL_STEP]
    step = int(np.asarray(step))
    entries = collect_entries(self._source, self._extra)
    if self._require_finite:
      check_finite(entries, "%s-%d" % (self._prefix, step))
    prefix = write_checkpoint(self._prefix, entries, global_step=step,
                              record=self._record)
    kept = [p for p in self._checkpoints if p != prefix] + [prefix]
    stale = []
    if self._max_to_keep is not None and len(kept) > self._max_to_keep:
      stale, kept = kept[:-self._max_to_keep], kept[-self._max_to_keep:]
    files.write_state(self._directory, kept)
    self._checkpoints = kept
    for old in stale:  # after the state file stops naming them
      files.delete_checkpoint(old)
    return prefix

  def restore(self, path=None, allow_missing=False):
    """Restores path (default: the latest checkpoint); returns a RestoreResult."""
    path = path or self.latest_checkpoint or self._directory
    return restore_checkpoint(path, self._source, self._extra, allow_missing=allow_missing)

  def restore_or_initialize(self):
    """Restores the latest checkpoint and returns its step, or returns None if none.

    With no checkpoint, the variables keep the initial values they were created with.
    """
    if self.latest_checkpoint is None:
      return None
    result = self.restore(self.latest_checkpoint)
    if result.global_step is not None:
      return result.global_step
    return files.step_from_prefix(result.path)
