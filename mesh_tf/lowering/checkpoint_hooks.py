"""The original's Estimator checkpoint hooks, for code that still installs them.

The original copied slices to and from full-size master variables around checkpoints.
Here the slices are the only state, so the copies these hooks trigger
(`Lowering.copy_slices_to_masters` / `copy_masters_to_slices`) move nothing; the hooks
keep the original's call points so an Estimator-style loop runs unchanged.
"""


class MtfCheckpointSaverListener:
  """Runs `lowering.copy_slices_to_masters()` before each save (tf.estimator's
  CheckpointSaverListener protocol)."""

  def __init__(self, lowering):
    self._op = None
    self._lowering = lowering

  def begin(self):
    self._op = self._lowering.copy_slices_to_masters()

  def before_save(self, session, global_step_value):
    """Brings the checkpointed values up to date (nothing to copy in this port)."""
    del global_step_value
    if session is not None and self._op is not None:
      session.run(self._op)
    return self._op

  def after_save(self, session, global_step_value):
    del session, global_step_value

  def end(self, session, global_step_value):
    del session, global_step_value


class MtfRestoreHook:
  """Runs `lowering.copy_masters_to_slices()` once the session exists (tf.estimator's
  SessionRunHook protocol)."""

  def __init__(self, lowering):
    self._op = None
    self._lowering = lowering

  def begin(self):
    self._op = self._lowering.copy_masters_to_slices()

  def after_create_session(self, session, coord):
    """Moves restored values into the slices (already there in this port)."""
    del coord
    if session is not None and self._op is not None:
      session.run(self._op)
    return self._op
