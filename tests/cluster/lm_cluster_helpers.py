"""The `make train` LM config at toy size, run by the trainer on a cluster or locally."""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

import gin
import numpy as np
import tensorflow as tf

import cluster_helpers
from cluster_helpers import trainer_helpers

# The Makefile's model and layout (mesh batch:2,model:4); data and sizes from the
# shared tiny-LM bindings so a step takes milliseconds.
GIN_FILES = ["models/lm_cpu_small.gin", "layouts/2x2_dp_mp.gin"]


def lm_params(model_dir, corpus, train_steps=4, save_every=2):
  """gin bindings of the toy LM, with a loss summary at every step."""
  return trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=train_steps,
                                          save_every=save_every, log_every=1)


def cluster_command(params, cluster, mode="train"):
  """argv of the trainer as the chief of `cluster`."""
  cmd = [sys.executable, "-m", "models.transformer.main", "--cluster=" + cluster,
         "--mode=" + mode]
  cmd += ["--gin_file=%s" % f for f in GIN_FILES]
  return cmd + ["--gin_param=%s" % p for p in params]


def run_here(params, extra=()):
  """utils.run in this process (8 local CPUs) with the toy LM's files and params."""
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    gin_setup.parse_gin(GIN_FILES, list(params) + list(extra))
    return utils.run()
  finally:
    gin.clear_config()


def losses_of(model_dir):
  """[(step, loss)] of the run's loss summaries."""
  from models.transformer.trainer import summaries  # pylint: disable=g-import-not-at-top
  return sorted(summaries.read_scalars(str(model_dir))["loss"])


def checkpoint_weights(model_dir):
  """{name: value} of model_dir's latest checkpoint, without global_step and the
  run record (a string)."""
  reader = tf.train.load_checkpoint(str(model_dir))  # a directory or a prefix
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n not in ("global_step", "mesh_tf_run_record")}


def assert_same_weights(a, b):
  """Both checkpoints hold the same names and (to float tolerance) values."""
  assert sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


SPMD = "cluster_setup.cluster_config.mode = 'spmd'"


def peer_command(params):
  """argv of one SPMD peer of the trainer (its task comes from TF_CONFIG)."""
  cmd = cluster_command(list(params) + [SPMD], "x:1")
  return [a for a in cmd if not a.startswith("--cluster=")]


@contextlib.contextmanager
def spmd_peers(params, log_dir, num_tasks=2):
  """Context manager: the trainer's num_tasks SPMD peers (TF_CONFIG each), logging to
  log_dir/peer<i>.txt; yields their Popen objects; always kills them at the end."""
  addresses = ["localhost:%d" % p for p in cluster_helpers.free_ports(num_tasks)]
  procs, logs = [], []
  try:
    for task in range(num_tasks):
      config = {"cluster": {"worker": addresses},
                "task": {"type": "worker", "index": task}}
      logs.append(open(log_dir / ("peer%d.txt" % task), "w"))
      procs.append(subprocess.Popen(
          peer_command(params), cwd=cluster_helpers.REPO_ROOT,
          env=dict(cluster_helpers.env(), TF_CONFIG=json.dumps(config)),
          stdout=logs[-1], stderr=subprocess.STDOUT))
    yield procs
  finally:
    cluster_helpers.stop(procs)
    for log in logs:
      log.close()


def peer_logs(log_dir, num_tasks=2):
  """The peers' output texts."""
  return [(log_dir / ("peer%d.txt" % t)).read_text() for t in range(num_tasks)]


def wait_all(procs, timeout):
  """Waits for every process (bounded); returns their exit statuses."""
  deadline = time.time() + timeout
  return [p.wait(timeout=max(1.0, deadline - time.time())) for p in procs]


def wait_for_text(path, text, procs, timeout):
  """Waits until the file at path contains text (fails if a process ends first)."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if text in path.read_text():
      return
    assert all(p.poll() is None for p in procs), path.read_text()[-3000:]
    time.sleep(0.1)
  raise AssertionError("no %r in %s after %ds" % (text, path, timeout))


def run_spmd(params, log_dir, timeout=300):
  """Runs the two peers to the end; returns their output texts (asserting success)."""
  with spmd_peers(params, log_dir) as procs:
    codes = wait_all(procs, timeout)
  outs = peer_logs(log_dir)
  for code, out in zip(codes, outs):
    assert code == 0, out[-3000:]
  return outs


EVAL_DURING_TRAINING = "utils.run.eval_steps = 1"


class LocalLm:
  """The toy LM trained 4 steps (checkpoints at 2 and 4, an eval batch after each) in
  this process on 8 local CPUs: the single-process reference of the cluster tests (see
  conftest.local_lm). A directory that holds a finished run is read, not trained
  again."""

  def __init__(self, directory):
    self.model_dir = directory / "local"
    done = directory / "history.json"  # written last, once the run has finished
    if not done.exists():
      shutil.rmtree(self.model_dir, ignore_errors=True)  # a run cut short starts anew
      corpus = trainer_helpers.write_corpus(directory)
      history = run_here(lm_params(self.model_dir, corpus) + [EVAL_DURING_TRAINING])
      done.write_text(json.dumps(history))
    self.corpus = os.path.join(str(directory), "corpus.txt")
    self.history = [tuple(h) for h in json.loads(done.read_text())]

  def losses(self, steps=4):
    """The losses of steps 1..steps."""
    assert [s for s, _ in self.history] == [1, 2, 3, 4]
    return [l for _, l in self.history[:steps]]

  def eval_results(self, step):
    """The text of eval/eval_results-<step>.txt written during training."""
    return (self.model_dir / "eval" / ("eval_results-%d.txt" % step)).read_text()

  def weights(self, step=4):
    """{name: value} of the checkpoint after `step` steps (2 or 4)."""
    return checkpoint_weights(self.model_dir / ("model.ckpt-%d" % step))
