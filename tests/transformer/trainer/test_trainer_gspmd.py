"""The trainer on the GSPMD backend (steps under tf.function(jit_compile=True)): train,
eval and eval-time decoding give the numbers of a single device."""
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

import trainer_helpers
from decode_checks import assert_greedy_decodes
from models.transformer.trainer import gin_setup
from models.transformer import synthetic_tasks
from models.transformer import utils
from models.transformer.vocabulary import ByteVocabulary
from trainer_helpers import run_with

GSPMD_2X4 = ["make_mesh_impl.backend = 'gspmd'", "utils.run.mesh_shape = 'b:2;m:4'",
             "utils.run.layout_rules = 'batch:b;d_ff:m;heads:m;vocab:m'"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return trainer_helpers.write_corpus(tmp_path_factory.mktemp("corpus"))


def _lm_params(model_dir, corpus, train_steps=2):
  return trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=train_steps,
                                          save_every=train_steps, log_every=1)


def test_gspmd_train_and_eval_equal_single_device(tmp_path, corpus):
  single_params = _lm_params(tmp_path / "single", corpus)
  single = run_with(single_params)
  # Same seed, so the same initial weights: the losses must follow single-device ones.
  gspmd = run_with(_lm_params(tmp_path / "gspmd", corpus) + GSPMD_2X4)
  assert [s for s, _ in gspmd] == [1, 2]
  assert [l for _, l in gspmd] == pytest.approx([l for _, l in single], rel=1e-4)
  assert os.path.exists(str(tmp_path / "gspmd" / "model.ckpt-2.index"))
  # The single-device checkpoint evaluated under GSPMD [2,4] and on one device.
  eval_params = single_params + ["utils.run.dataset_split = 'validation'"]
  single_eval = run_with(eval_params, mode="eval")
  gspmd_eval = run_with(eval_params + GSPMD_2X4, mode="eval")
  assert gspmd_eval["step"] == single_eval["step"] == 2
  assert gspmd_eval["batches"] == single_eval["batches"] == 2
  assert gspmd_eval["loss"] == pytest.approx(single_eval["loss"], rel=1e-5)
  assert gspmd_eval["token_accuracy"] == pytest.approx(single_eval["token_accuracy"],
                                                       abs=1e-6)


def test_gspmd_eval_decodes_like_single_device(tmp_path):
  # A barely trained encoder-decoder: the decodes are arbitrary but must agree.
  params = ["utils.run.model_type = 'bitransformer'",
            "num_layers = 1", "d_model = 16", "d_ff = 32", "num_heads = 4", "d_kv = 4",
            "dropout_rate = 0.0", "Unitransformer.max_length = 6",
            "utils.run.model_dir = %r" % str(tmp_path / "bi"),
            "utils.run.sequence_length = {'inputs': 6, 'targets': 6}",
            "utils.run.batch_size = ('sequences_per_batch', 8)",
            "utils.run.train_steps = 1", "utils.run.learning_rate_schedule = 0.01",
            "utils.run.train_dataset_fn = @dataset.synthetic_reverse_dataset",
            "utils.run.eval_dataset_fn = @dataset.synthetic_reverse_dataset",
            "synthetic_reverse_dataset.num_tokens = 4"]
  run_with(params)
  eval_params = params + ["utils.run.dataset_split = 'validation'",
                          "utils.run.perplexity_eval_steps = 1",
                          "utils.run.eval_decode_batches = 1"]
  single = run_with(eval_params, mode="eval")
  gspmd = run_with(eval_params + GSPMD_2X4, mode="eval")
  assert gspmd["decoded_sequences"] == single["decoded_sequences"] == 8
  assert gspmd["loss"] == pytest.approx(single["loss"], rel=1e-5)
  assert gspmd["token_accuracy"] == pytest.approx(single["token_accuracy"], abs=1e-6)
  assert gspmd["sequence_accuracy"] == pytest.approx(single["sequence_accuracy"], abs=1e-6)

  # The decoded ids themselves agree, row by row (an accuracy may be 0 for both), and
  # they are the greedy decodes under the checkpoint's logits.
  vocab = ByteVocabulary()
  lengths = {"inputs": 6, "targets": 6}
  batch = next(synthetic_tasks.synthetic_reverse_dataset(
      lengths, vocab, "validation", num_tokens=4).map(
          lambda e: {k: tf.pad(e[k], [[0, 6 - tf.shape(e[k])[0]]]) for k in e}).batch(
              8).as_numpy_iterator())
  decoded = {}
  for name, extra, mesh_shape, layout_rules in (
      ("single", [], "", ""),
      ("gspmd", GSPMD_2X4[:1], "b:2;m:4", "batch:b;d_ff:m;heads:m;vocab:m")):
    gin.clear_config()
    try:
      gin_setup.parse_gin([], params + extra)
      estimator = utils.get_estimator(
          "bitransformer", vocab, mesh_shape, layout_rules, str(tmp_path / "bi"), 8,
          lengths, True, 0.01, 2, 2, None, None, None, None, False, None, 1, None)
      rows = list(estimator.predict(
          lambda p: tf.data.Dataset.from_tensors({"inputs": batch["inputs"]})))
      decoded[name] = np.stack([r["outputs"] for r in rows])
      if name == "single":
        assert_greedy_decodes(estimator, batch["inputs"], decoded[name],
                              vocab.vocab_size)
    finally:
      gin.clear_config()
  assert decoded["single"].shape == (8, 6) and decoded["single"].any()
  np.testing.assert_array_equal(decoded["gspmd"], decoded["single"])
