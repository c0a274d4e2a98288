"""A run stopped at any step and resumed trains on the batches the uninterrupted run
would have: its losses match step for step, on the same layout and on another one."""
import gin
import numpy as np
import pytest

import trainer_helpers
from models.transformer import dataset
from models.transformer.trainer import summaries

STEPS, STOP = 6, 3
TWO_BY_FOUR = ["utils.run.mesh_shape = 'batch:2,model:4'", "utils.run.layout_rules = "
               "'batch:batch,d_ff:model,heads:model,vocab:model'"]


@gin.configurable(module="exact_resume_test")
def shuffled_corpus(**kwargs):
  """The tiny corpus, shuffled: no op seed, so its order comes from utils.run.seed."""
  return dataset.text_corpus_dataset(**kwargs).shuffle(32)


def _params(model_dir, corpus, train_steps):
  # save_checkpoints_steps beyond the run: the only checkpoint is the final one (as a
  # SIGTERM stop writes it), at a step no period would pick; float32 checkpoints (the
  # default bfloat16 ones round the weights a resumed run starts from)
  return trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=train_steps,
                                          save_every=100, log_every=1) + [
      "utils.run.train_dataset_fn = @exact_resume_test.shuffled_corpus",
      "get_variable_dtype.master_dtype = 'float32'"]


def _losses(model_dir):
  """The loss summaries of steps 1.. in order (a resumed run adds its own)."""
  losses = sorted(summaries.read_scalars(str(model_dir))["loss"])
  assert [s for s, _ in losses] == list(range(1, STEPS + 1)), losses
  return [l for _, l in losses]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """(corpus, losses of steps 1..STEPS) of an uninterrupted single-device run."""
  root = tmp_path_factory.mktemp("uninterrupted")
  corpus = trainer_helpers.write_corpus(root)
  trainer_helpers.run_with(_params(root / "model", corpus, STEPS))
  return corpus, _losses(root / "model")


def _stop_and_resume(model_dir, corpus, capsys, first=(), then=()):
  """Trains to STOP, then the same command to STEPS; returns the second run's output."""
  trainer_helpers.run_with(_params(model_dir, corpus, STOP) + list(first))
  capsys.readouterr()
  trainer_helpers.run_with(_params(model_dir, corpus, STEPS) + list(then))
  return capsys.readouterr().out


def test_resumed_run_sees_the_batches_the_uninterrupted_run_saw(reference, tmp_path,
                                                                capsys):
  corpus, expected = reference
  out = _stop_and_resume(tmp_path / "model", corpus, capsys)
  assert "at step %d" % STOP in out, out
  assert ("the input pipeline skips the %d batches (%d examples) it already trained on"
          % (STOP, STOP * 8)) in out, out
  assert "not reproducible" not in out
  np.testing.assert_allclose(_losses(tmp_path / "model"), expected, rtol=1e-6)


def test_resume_on_another_layout_sees_the_same_batches(reference, tmp_path, capsys):
  corpus, expected = reference
  _stop_and_resume(tmp_path / "model", corpus, capsys, first=TWO_BY_FOUR)
  np.testing.assert_allclose(_losses(tmp_path / "model"), expected, rtol=1e-5)


def test_unseeded_run_says_its_order_may_not_replay(reference, tmp_path, capsys):
  out = _stop_and_resume(tmp_path / "model", reference[0], capsys,
                         then=["utils.run.seed = None"])
  assert "the input pipeline skips the %d batches" % STOP in out, out
  assert "utils.run.seed is None" in out and "not reproducible" in out, out
