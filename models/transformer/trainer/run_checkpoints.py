"""The trainer's checkpoint manager and the lines it prints, shared by both train loops
(train_loop.Trainer and spmd_train_loop.ChiefSaver), so either mode resumes the other's
run and a user sees the same lines from both."""
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
