"""SIGKILL a training run mid-way, then start it again: it resumes, nothing is corrupt."""
import os
import re
import signal
import subprocess
import time

import tensorflow as tf

import trainer_helpers
from mesh_tf.checkpoint import step_from_prefix


def _kept_checkpoints(model_dir):
  state = tf.train.get_checkpoint_state(model_dir)
  return list(state.all_model_checkpoint_paths) if state else []


def test_kill_and_resume(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "model"
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=100000,
                                            save_every=2, keep=3, log_every=1)
  env = trainer_helpers.main_env()
  proc = subprocess.Popen(trainer_helpers.main_command(params), cwd=trainer_helpers.REPO_ROOT,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 180
    while time.time() < deadline:
      steps = [step_from_prefix(p) for p in _kept_checkpoints(str(model_dir))]
      if steps and max(steps) >= 6:
        break
      assert proc.poll() is None, "trainer exited early with %s" % proc.returncode
      time.sleep(0.2)
    else:
      raise AssertionError("no checkpoint >= 6 within 180 s")
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()

  # Every listed checkpoint loads whole (a kill during a save may leave temporaries,
  # which the restart removes).
  names = os.listdir(model_dir)
  leftovers = [n for n in names if ".tmp" in n]
  kept = _kept_checkpoints(str(model_dir))
  assert 1 <= len(kept) <= 3
  for prefix in kept:
    prefix = os.path.join(str(model_dir), prefix)
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
    assert int(reader.get_tensor("global_step")) == step_from_prefix(prefix)
  for index in [n for n in names if n.endswith(".index") and ".tmp" not in n]:
    assert os.path.exists(os.path.join(str(model_dir), index[:-len(".index")]
                                       + ".data-00000-of-00001"))
  last = max(step_from_prefix(p) for p in kept)
  # A kill after a save but before the state file listed it leaves a newer whole
  # checkpoint, which the restart takes (and says so).
  whole = [step_from_prefix(n[:-len(".index")]) for n in names
           if n.endswith(".index") and ".tmp" not in n]
  unlisted = max(whole) if max(whole) > last else None
  if unlisted is not None:
    reader = tf.train.load_checkpoint(os.path.join(str(model_dir),
                                                   "model.ckpt-%d" % unlisted))
    assert int(reader.get_tensor("global_step")) == unlisted
    last = unlisted

  # Restart with a few more steps: it resumes at the last checkpoint's step.
  final = last + 2
  params = params[:]
  params[params.index("utils.run.train_steps = 100000")] = "utils.run.train_steps = %d" % final
  result = trainer_helpers.run_main(params)
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r"resumed from \S*model\.ckpt-%d at step %d" % (last, last),
                   result.stdout), result.stdout
  if unlisted is not None:
    assert re.search(r"found newer complete checkpoint\(s\) the state file does not "
                     r"list: [^;]*model\.ckpt-%d\b" % unlisted, result.stdout + result.stderr)
  reported = [int(s) for s in re.findall(r"^step (\d+)/%d " % final, result.stdout,
                                         re.M)]
  assert reported == [last + 1, last + 2]
  reader = tf.train.load_checkpoint(str(model_dir))
  assert int(reader.get_tensor("global_step")) == final
  assert not [n for n in os.listdir(model_dir) if ".tmp" in n]
  for name in leftovers:  # listed in the restart's "removed ..." line
    assert re.search(r"removed \d+ file\(s\) left by an interrupted run in \S+: .*%s"
                     % re.escape(name), result.stdout), result.stdout
