"""The trainer's checkpoint manager and the lines it prints, shared by both train loops.

train_loop.Trainer (one process) and spmd_train_loop.ChiefSaver (the chief of an SPMD
run) open model_dir's checkpoints the same way: one mtf.CheckpointManager that keeps
keep_checkpoint_max checkpoints, refuses NaN/Inf values, saves `global_step` beside the
model and stamps each checkpoint with the run record (run_record), so either mode resumes
the other's run. A user sees the same lines from both: what the manager found wrong in
model_dir, "resumed from", "saved checkpoint".
"""
import mesh_tf as mtf
from models.transformer.trainer import run_record


def open_manager(model_dir, values, global_step, keep_checkpoint_max):
  """The run's mtf.CheckpointManager over `values` (a mesh impl or {name: value}),
  after reporting what it found in model_dir: a note on skipped or damaged files, and
  "rewrote the state file" when the state file had to be rebuilt."""
  manager = mtf.CheckpointManager(
      model_dir, values, max_to_keep=keep_checkpoint_max,
      extra_variables={"global_step": global_step}, require_finite=True,
      record=run_record.active_text())  # utils.run's vocabulary and hyperparameters
  if manager.note:
    print(manager.note, flush=True)
  if manager.repair_state():
    print("rewrote the state file of %s" % model_dir, flush=True)
  return manager


def report_resumed(path, step):
  """The line both loops print after restoring checkpoint `path` at `step`."""
  print("resumed from %s at step %d" % (path, step), flush=True)


def report_saved(path):
  """The line both loops print after writing checkpoint `path`."""
  print("saved checkpoint %s" % path, flush=True)
