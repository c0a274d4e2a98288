"""The encoder-decoder example (gin_configs/examples/reverse_tokens_cpu.gin) and the eval
metrics: teacher-forced token accuracy and exact-match sequence accuracy of decodes."""
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

import decode_checks
import mesh_tf as mtf
import mtf_testing
import trainer_helpers
from mesh_tf.errors import MtfError
from models.transformer import dataset as dataset_lib
from models.transformer.trainer import evaluation
from models.transformer.trainer import gin_setup
from models.transformer.trainer import run_setup
from models.transformer.trainer import summaries
from models.transformer import utils
from models.transformer.vocabulary import ByteVocabulary

EXAMPLE_FILES = ["models/bi_cpu_small.gin", "problems/reverse_tokens.gin",
                 "examples/reverse_tokens_cpu.gin"]


def run_files(files, params, **kwargs):
  """utils.run in this process under defaults.gin, the gin files and params."""
  gin.clear_config()
  try:
    gin_setup.parse_gin(files, params)
    return utils.run(**kwargs)
  finally:
    gin.clear_config()


def test_token_accuracy_counts_match_tf_on_every_layout(mesh_impl):
  # "hidden" stands for the vocab dim so that the layouts split it; ids 13..15 are
  # the vocab padding, which must never be predicted.
  batch, length, vocab, vocab_size = 8, 5, 16, 13
  rng = np.random.RandomState(0)
  logits = rng.normal(size=[batch, length, vocab]).astype(np.float32)
  logits[..., 0] = -10.0  # no target is predicted as padding
  logits[:, :2, 14] = 50.0  # the padded id would win without the mask
  best_real = logits[..., :vocab_size].argmax(-1)
  targets = np.where(rng.rand(batch, length) < 0.6, best_real,
                     rng.randint(2, vocab_size, size=[batch, length]))
  targets[:, -1] = 0  # padding never counts
  targets = targets.astype(np.int32)
  dims = [mtf.Dimension("batch", batch), mtf.Dimension("length", length)]
  vocab_dim = mtf.Dimension("hidden", vocab)

  def tf_counts(tf_logits, tf_targets):
    predictions = tf.argmax(tf_logits[..., :vocab_size], axis=-1, output_type=tf.int32)
    weights = tf.cast(tf.not_equal(tf_targets, 0), tf.float32)
    correct = tf.cast(tf.equal(predictions, tf_targets), tf.float32) * weights
    return [tf.reduce_sum(correct), tf.reduce_sum(weights)]

  (correct, total), _ = mtf_testing.check_against_tf(
      mesh_impl, [(logits, dims + [vocab_dim]), (targets, dims)],
      lambda x, t: list(evaluation.token_accuracy_counts(x, t, vocab_size)), tf_counts,
      grad=False, labels=["correct", "total"])
  assert total == batch * (length - 1)
  assert correct == np.sum((targets == best_real) & (targets != 0))
  assert 0 < correct < total


def test_exact_matches_cut_at_eos_and_skip_empty_rows():
  targets = np.array([[5, 6, 1, 0], [7, 1, 0, 0], [8, 9, 1, 0], [0, 0, 0, 0]])
  decoded = np.array([[5, 6, 1, 4],   # junk after EOS is ignored: a match
                      [7, 7, 1, 0],   # wrong token
                      [8, 9, 9, 1],   # too long
                      [3, 1, 0, 0]])  # all-padding target row: not counted
  assert evaluation.exact_matches(decoded, targets) == (1, 3)
  # Rows of different lengths are compared zero-padded.
  assert evaluation.exact_matches(decoded[:, :3], targets) == (1, 3)
  np.testing.assert_array_equal(utils.clean_decodes([[1, 2, 1], [2, 1, 3]]),
                                [[1, 0, 0], [2, 1, 0]])


@pytest.fixture(scope="module")
def reverse_model(tmp_path_factory):
  """The example, shortened (shorter sequences and fewer steps), trained once."""
  model_dir = str(tmp_path_factory.mktemp("reverse") / "model")
  params = ["utils.run.model_dir = %r" % model_dir,
            "utils.run.sequence_length = {'inputs': 8, 'targets': 8}",
            "Unitransformer.max_length = 8",
            "utils.run.train_steps = 200", "utils.run.save_checkpoints_steps = 200",
            "utils.run.iterations_per_loop = 100"]
  history = run_files(EXAMPLE_FILES, params)
  return {"params": params, "model_dir": model_dir, "history": history}


def test_reverse_tokens_example_learns_the_task(reverse_model, capsys):
  history = reverse_model["history"]
  assert [s for s, _ in history] == [100, 200]
  assert history[-1][1] < history[0][1]
  results = run_files(EXAMPLE_FILES, reverse_model["params"] + [
      "utils.run.dataset_split = 'validation'", "utils.run.perplexity_eval_steps = 4",
      "utils.run.eval_decode_batches = 2"], mode="eval")
  assert results["batches"] == 4 and results["decoded_sequences"] == 64
  assert results["token_accuracy"] > 0.9
  # Greedy decoding (encoder padding masked) agrees with teacher forcing.
  assert results["sequence_accuracy"] > 0.6
  out = capsys.readouterr().out
  assert "token accuracy %.4f" % results["token_accuracy"] in out
  assert "sequence accuracy %.4f (64 sequences)" % results["sequence_accuracy"] in out
  eval_dir = os.path.join(reverse_model["model_dir"], "eval")
  text = open(os.path.join(eval_dir, "eval_results-200.txt")).read()
  assert "token_accuracy = %.9g\n" % results["token_accuracy"] in text
  assert "sequence_accuracy = %.9g\n" % results["sequence_accuracy"] in text
  scalars = summaries.read_scalars(eval_dir)
  assert scalars["eval/token_accuracy"][-1] == (
      200, pytest.approx(results["token_accuracy"], rel=1e-6))
  assert scalars["eval/sequence_accuracy"][-1] == (
      200, pytest.approx(results["sequence_accuracy"], rel=1e-6))


@pytest.fixture(scope="module")
def lm_params(tmp_path_factory):
  """A tiny LM trained 2 steps with a periodic eval at step 2: its gin params and dir."""
  root = tmp_path_factory.mktemp("lm")
  corpus = trainer_helpers.write_corpus(root)
  params = trainer_helpers.tiny_lm_bindings(root / "m", corpus, train_steps=2,
                                            save_every=2)
  trainer_helpers.run_with(params + ["utils.run.eval_steps = 1"])
  return {"params": params, "model_dir": str(root / "m"), "corpus": corpus}


def test_periodic_eval_reports_token_accuracy(lm_params):
  scalars = summaries.read_scalars(os.path.join(lm_params["model_dir"], "eval"))
  [(step, accuracy)] = scalars["eval/token_accuracy"]
  assert step == 2
  assert "eval/sequence_accuracy" not in scalars  # eval_decode_batches = 0
  # The accuracy of the first validation batch (eval_steps = 1), recomputed from the
  # step-2 checkpoint's logits in numpy: argmax over the real ids == target, over the
  # non-padding targets.
  vocab = ByteVocabulary()
  gin.clear_config()
  try:
    gin_setup.parse_gin([], lm_params["params"])
    batch = next(run_setup.batched_dataset(
        lambda **kw: dataset_lib.text_corpus_dataset(
            **kw, glob=lm_params["corpus"], validation_fraction=0.3),
        16, vocab, "validation", 8, repeat=False).as_numpy_iterator())
    estimator = utils.get_estimator(
        "lm", vocab, "", "", lm_params["model_dir"], 8, 16, True, 0.01, 2, 2, None,
        None, None, None, False, None, 2, None)
    logits = decode_checks.model_logits(estimator, batch)[..., :vocab.vocab_size]
  finally:
    gin.clear_config()
  weights = batch["targets"] != 0
  correct = (logits.argmax(-1) == batch["targets"]) & weights
  assert accuracy == pytest.approx(correct.sum() / weights.sum(), abs=1e-6)
  assert correct.any(), "an all-wrong batch would not tell the counts apart"


def test_sequence_accuracy_of_a_language_model_is_an_error(lm_params):
  with pytest.raises(MtfError, match="eval_decode_batches=2.*encoder-decoder"):
    trainer_helpers.run_with(lm_params["params"] + ["utils.run.eval_decode_batches = 2"],
                             mode="eval")


def test_sequence_accuracy_of_packed_data_is_an_error(reverse_model):
  with pytest.raises(MtfError, match="eval_decode_batches=1.*packed"):
    run_files(EXAMPLE_FILES, reverse_model["params"] + [
        "utils.run.eval_decode_batches = 1", "synthetic_reverse_dataset.pack = True"],
              mode="eval")
