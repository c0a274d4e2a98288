"""The gin-configured trainer in-process: train, checkpoints, summaries, resume, eval."""
import math
import os

import numpy as np
import pytest

import trainer_helpers
from trainer_helpers import run_with
from models.transformer.trainer import summaries
from models.transformer import utils


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny LM trained 6 steps (checkpoint every 2, keep 2) on one device, once.

  The tests below only read its model dir (the resume test resumes a copy), so they
  pass in any order and alone."""
  import io  # pylint: disable=g-import-not-at-top
  import contextlib  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("trained")
  corpus = trainer_helpers.write_corpus(root)
  model_dir = root / "model"
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=6)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    history = run_with(params)
  return {"params": params, "model_dir": str(model_dir), "corpus": corpus,
          "history": history, "out": out.getvalue()}


@pytest.fixture(scope="module")
def single_device_eval(trained):
  """Eval of the step-6 checkpoint on one device: the reference of every layout."""
  return run_with(trained["params"] + ["utils.run.dataset_split = 'validation'"],
                  mode="eval", eval_checkpoint_step=6)


def test_train_checkpoints_summaries_progress_and_resume(trained, capsys):
  history, out = trained["history"], trained["out"]
  model_dir = trained["model_dir"]
  assert [s for s, _ in history] == [2, 4, 6]
  assert history[-1][1] < history[0][1]  # the loss falls
  for step in (2, 4, 6):
    assert "step %d/6 [" % step in out
  assert "tokens/s" in out and "ETA" in out
  # Only the last 2 checkpoints are kept, and the state file names them.
  ckpts = sorted(f for f in os.listdir(model_dir) if f.endswith(".index"))
  assert ckpts == ["model.ckpt-4.index", "model.ckpt-6.index"]
  assert not [f for f in os.listdir(model_dir) if ".tmp" in f]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-6")
  assert int(tf.train.load_checkpoint(model_dir).get_tensor("global_step")) == 6
  scalars = summaries.read_scalars(model_dir)
  assert {"loss", "learning_rate", "tokens_per_second"} <= set(scalars)
  assert [s for s, _ in scalars["loss"]] == [2, 4, 6]
  np.testing.assert_allclose([v for _, v in scalars["loss"]], [l for _, l in history],
                             rtol=1e-6)
  assert all(v == pytest.approx(0.01) for _, v in scalars["learning_rate"])
  config = open(os.path.join(model_dir, "operative_config.gin")).read()
  assert "run.train_steps = 6" in config
  assert "Unitransformer.d_model = %d_model" in config and "\nd_model = 16\n" in config

  # Starting again with more steps resumes at the saved step and continues (in a
  # copy, so that the other tests still see the run that stopped at step 6).
  import shutil  # pylint: disable=g-import-not-at-top
  resumed_dir = model_dir + "_resumed"
  shutil.copytree(model_dir, resumed_dir)
  model_dir = resumed_dir
  history = run_with([p.replace(trained["model_dir"], resumed_dir)
                      for p in trained["params"]] + ["utils.run.train_steps = 8"])
  out = capsys.readouterr().out
  assert "resumed from %s at step 6" % os.path.join(model_dir, "model.ckpt-6") in out
  assert [s for s, _ in history] == [8]
  assert "step 8/8 [" in out and "step 2/8" not in out
  assert int(tf.train.load_checkpoint(model_dir).get_tensor("global_step")) == 8


@pytest.mark.parametrize("layout_params", [
    [],
    ["utils.run.mesh_shape = 'b:2;m:4'",
     "utils.run.layout_rules = 'batch:b;d_ff:m;heads:m;vocab:m'"],
    ["utils.run.mesh_shape = 'b:8;m:8'", "make_mesh_impl.backend = 'simd'",
     "utils.run.layout_rules = 'batch:b;d_ff:m;vocab:m'"],
], ids=["single", "placement_2x4_dp_mp", "simd_8x8"])
def test_eval_loss_is_the_same_under_every_layout(trained, single_device_eval,
                                                 layout_params, capsys):
  model_dir = trained["model_dir"]
  if layout_params:
    results = run_with(trained["params"] + layout_params
                       + ["utils.run.dataset_split = 'validation'"], mode="eval",
                       eval_checkpoint_step=6)
    assert "loss %.6f" % results["loss"] in capsys.readouterr().out
    assert results["loss"] == pytest.approx(single_device_eval["loss"], rel=1e-5)
  else:
    results = single_device_eval
  assert results["step"] == 6 and results["batches"] == 2
  assert results["perplexity"] == pytest.approx(math.exp(results["loss"]), rel=1e-9)
  text = open(os.path.join(model_dir, "eval", "eval_results-6.txt")).read()
  assert "loss = %.9g" % results["loss"] in text
  scalars = summaries.read_scalars(os.path.join(model_dir, "eval"))
  assert scalars["eval/loss"][-1] == (6, pytest.approx(results["loss"], rel=1e-6))


def test_periodic_eval_during_training(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  params = trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus, train_steps=4,
                                            save_every=4)
  run_with(params + ["utils.run.eval_steps = 1"])
  scalars = summaries.read_scalars(str(tmp_path / "m" / "eval"))
  assert [s for s, _ in scalars["eval/loss"]] == [4]
  assert scalars["eval/perplexity"][0][1] == pytest.approx(
      math.exp(scalars["eval/loss"][0][1]), rel=1e-5)
