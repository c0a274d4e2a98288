"""Trainer processes: one writer per model_dir, and SIGTERM / Ctrl-C stop with a checkpoint."""
import os
import re
import signal
import subprocess
import time

import pytest
import tensorflow as tf

import trainer_helpers
from models.transformer.trainer import stop_signals


def _start(params, log_dir):
  """Starts the trainer; its stdout/stderr go to files (no pipe to fill up)."""
  env = trainer_helpers.main_env()
  out = open(log_dir / "out.txt", "w")
  err = open(log_dir / "err.txt", "w")
  proc = subprocess.Popen(trainer_helpers.main_command(params),
                          cwd=trainer_helpers.REPO_ROOT, env=env, stdout=out, stderr=err)
  out.close()
  err.close()
  return proc


def _wait_for_step(proc, log_dir, step, timeout=180):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if re.search(r"^step %d/" % step, (log_dir / "out.txt").read_text(), re.M):
      return
    assert proc.poll() is None, "trainer exited early: %s" % (
        (log_dir / "err.txt").read_text()[-2000:])
    time.sleep(0.2)
  raise AssertionError("the trainer did not reach step %d in %d s" % (step, timeout))


@pytest.fixture
def running_trainer(tmp_path):
  """(process, model_dir, params, log_dir) of a long run past step 2; killed at the end."""
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "model"
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=10 ** 7,
                                            save_every=10 ** 7, keep=3, log_every=1)
  proc = _start(params, tmp_path)
  try:
    _wait_for_step(proc, tmp_path, 2)
    yield proc, model_dir, params, tmp_path
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait()


def _stopped_step(log_dir, how):
  match = re.search(r"^stopped at step (\d+) by %s; resume by running the same command "
                    "again$" % how, (log_dir / "out.txt").read_text(), re.M)
  assert match, (log_dir / "out.txt").read_text()[-2000:]
  return int(match.group(1))


def _assert_checkpoint_at(model_dir, step):
  reader = tf.train.load_checkpoint(str(model_dir))
  assert int(reader.get_tensor("global_step")) == step
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("model.ckpt-%d" % step)


def test_second_trainer_is_refused_then_sigterm_saves_and_exits(running_trainer):
  proc, model_dir, params, log_dir = running_trainer
  second = trainer_helpers.run_main(params)
  assert second.returncode == 1
  assert ("model_dir %s is in use by another trainer (pid %d on host"
          % (model_dir, proc.pid)) in second.stderr, second.stderr[-2000:]
  assert "training" not in second.stdout  # refused before building anything
  assert proc.poll() is None  # the first run goes on unharmed
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=120) == 128 + signal.SIGTERM
  step = _stopped_step(log_dir, "SIGTERM")
  assert step >= 2
  _assert_checkpoint_at(model_dir, step)
  assert "Traceback" not in (log_dir / "err.txt").read_text()


def test_ctrl_c_saves_and_exits_130_without_a_traceback(running_trainer):
  proc, model_dir, _, log_dir = running_trainer
  proc.send_signal(signal.SIGINT)
  assert proc.wait(timeout=120) == 130
  step = _stopped_step(log_dir, "Ctrl-C")
  _assert_checkpoint_at(model_dir, step)
  err = (log_dir / "err.txt").read_text()
  assert "Traceback" not in err and "interrupted" in err


def test_a_second_signal_aborts_at_once():
  # A process started in the background inherits SIGINT ignored (Python then keeps
  # SIG_IGN): give the test a known handler for GracefulStop to restore.
  outer = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with stop_signals.GracefulStop() as stop:
      os.kill(os.getpid(), signal.SIGINT)
      for _ in range(100):  # Python runs the handler between bytecodes
        if stop.requested:
          break
      assert stop.signum == signal.SIGINT
      with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100):
          pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  finally:
    signal.signal(signal.SIGINT, outer)


def test_no_model_dir_is_one_line_error():
  result = trainer_helpers.run_main(["utils.run.train_steps = 1"])
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "error: no model directory: pass --model_dir=DIR (or bind utils.run.model_dir in "
      "gin)")
