"""The `make train` LM config at toy size, run by the trainer on a cluster or locally."""
import sys

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
  from models.transformer import gin_setup, utils  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    gin_setup.parse_gin(GIN_FILES, list(params) + list(extra))
    return utils.run()
  finally:
    gin.clear_config()


def losses_of(model_dir):
  """[(step, loss)] of the run's loss summaries."""
  from models.transformer import summaries  # pylint: disable=g-import-not-at-top
  return sorted(summaries.read_scalars(str(model_dir))["loss"])


def checkpoint_weights(model_dir):
  """{name: value} of model_dir's latest checkpoint, without global_step."""
  reader = tf.train.load_checkpoint(str(model_dir))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n != "global_step"}


def assert_same_weights(a, b):
  """Both checkpoints hold the same names and (to float tolerance) values."""
  assert sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


