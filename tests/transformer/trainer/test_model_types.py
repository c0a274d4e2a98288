"""model_type "delimited_lm" and "aligned" through the trainer (utils.run), on toy sizes.

delimited_lm: an LM trained on each example's [inputs, targets] as one sequence; it
decodes by continuing "inputs EOS" and scores the targets part. aligned: a
non-autoregressive Unitransformer predicting targets from inputs position by position.
"""
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

import decode_checks
import mesh_tf as mtf
import trainer_helpers
from mesh_tf.errors import MtfError
from models.transformer import model_graph
from models.transformer import utils
from models.transformer.context import ModeKeys
from models.transformer.trainer import decode_io
from models.transformer.trainer import evaluation
from models.transformer.trainer import gin_setup
from models.transformer.vocabulary import ByteVocabulary

IN_LEN, TG_LEN, BATCH, STEPS = 6, 6, 8, 60
VOCAB = ByteVocabulary()
FIRST_TOKEN = VOCAB.encode("a")[0]  # the toy tokens are the letters "a".."f"


def toy_text2text(sequence_length, vocabulary, dataset_split, **unused_kwargs):
  """Unbatched {"inputs", "targets"}: a few letters + EOS, and the same reversed + EOS
  (so inputs and targets also align position by position, as "aligned" needs)."""
  del sequence_length, vocabulary, unused_kwargs
  rng = np.random.RandomState(0 if dataset_split == "train" else 1)
  inputs = np.zeros([64, IN_LEN], np.int32)
  targets = np.zeros([64, TG_LEN], np.int32)
  for row in range(64):
    n = rng.randint(2, IN_LEN)
    tokens = rng.randint(FIRST_TOKEN, FIRST_TOKEN + 6, n)
    inputs[row, :n], inputs[row, n] = tokens, 1
    targets[row, :n], targets[row, n] = tokens[::-1], 1
  return tf.data.Dataset.from_tensor_slices({"inputs": inputs, "targets": targets})


def toy_batch(split="validation"):
  """The first BATCH examples of toy_text2text as numpy arrays."""
  data = toy_text2text(None, None, split).batch(BATCH)
  return {k: v.numpy() for k, v in next(iter(data)).items()}


def bindings(model_dir, model_type):
  """gin bindings of a 1-layer d_model=8 model of model_type on toy_text2text."""
  return [
      "num_layers = 1", "d_model = 8", "d_ff = 16", "num_heads = 2", "d_kv = 4",
      "dropout_rate = 0.0", "Unitransformer.max_length = 16",
      "utils.run.model_dir = %r" % str(model_dir),
      "utils.run.model_type = %r" % model_type,
      "utils.run.sequence_length = {'inputs': %d, 'targets': %d}" % (IN_LEN, TG_LEN),
      "utils.run.batch_size = ('sequences_per_batch', %d)" % BATCH,
      "utils.run.train_steps = %d" % STEPS,
      "utils.run.save_checkpoints_steps = %d" % STEPS,
      "utils.run.iterations_per_loop = 15",
      "utils.run.learning_rate_schedule = 0.05",
      "utils.run.perplexity_eval_steps = 2",
  ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """Each type trained STEPS steps by utils.run: {type: {"params", "model_dir",
  "history"}}."""
  runs = {}
  for model_type in ("delimited_lm", "aligned"):
    model_dir = tmp_path_factory.mktemp(model_type) / "model"
    params = bindings(model_dir, model_type)
    history = trainer_helpers.run_with(params, train_dataset_fn=toy_text2text,
                                       eval_dataset_fn=toy_text2text)
    runs[model_type] = {"params": params, "model_dir": str(model_dir),
                        "history": history}
  return runs


def restored_graph(run, model_type, feature_keys, sequence_length):
  """An eval ModelGraph of model_type (under run's gin) with run's trained weights, on
  one device, and a function (features -> {name: numpy}) of its tensors."""
  gin.clear_config()
  try:
    gin_setup.parse_gin([], run["params"])
    model = utils.build_model(model_type, input_vocab_size=VOCAB.vocab_size,
                              output_vocab_size=VOCAB.vocab_size)
    graph = model_graph.ModelGraph(model, BATCH, sequence_length, feature_keys,
                                   ModeKeys.EVAL, utils.get_variable_dtype())
  finally:
    gin.clear_config()
  mesh_impl = mtf.PlacementMeshImpl("", "", [""])
  graph.lowering(mesh_impl)
  mtf.restore_checkpoint(run["model_dir"], mesh_impl)
  xent_sum, _, counted = evaluation.eval_counts(graph)
  tensors = {"targets": graph.targets, "weights": graph.weights, "loss": graph.loss,
             "logits": mtf.cast(graph.logits, tf.float32), "xent_sum": xent_sum,
             "counted": counted}

  def run_graph(features):
    lowering = graph.lowering(mesh_impl, {k: tf.constant(v, tf.int32)
                                          for k, v in features.items()})
    return {k: lowering.export_to_tf_tensor(t).numpy() for k, t in tensors.items()}
  return run_graph


def text2self(inputs, targets):
  """numpy: each row's nonzero inputs then its nonzero targets, zero-padded."""
  out = np.zeros([len(inputs), inputs.shape[1] + targets.shape[1]], np.int32)
  for row, (i, t) in enumerate(zip(inputs, targets)):
    ids = [x for x in i if x] + [x for x in t if x]
    out[row, :len(ids)] = ids
  return out


def log_softmax(logits):
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.mark.parametrize("model_type", ["delimited_lm", "aligned"])
def test_training_lowers_the_loss(trained, model_type):
  history = trained[model_type]["history"]
  assert [step for step, _ in history] == [15, 30, 45, 60]
  assert history[-1][1] < 0.8 * history[0][1], history


def test_build_model_offers_both_types_and_names_a_bad_one():
  gin.clear_config()
  try:
    gin_setup.parse_gin([], bindings("/unused", "lm"))
    delimited = utils.build_model("delimited_lm", input_vocab_size=20,
                                  output_vocab_size=20)
    aligned = utils.build_model("aligned", input_vocab_size=20, output_vocab_size=20)
    with pytest.raises(MtfError, match=r"model_type 'bert'.*utils.run.model_type"):
      utils.build_model("bert", input_vocab_size=20, output_vocab_size=20)
    with pytest.raises(MtfError, match=r"model_type 'aligned' needs a dataset of "
                       r"'inputs' and 'targets'"):
      model_graph.model_features(aligned, ["targets"])
  finally:
    gin.clear_config()
  assert (delimited.autoregressive, delimited.model_type) == (True, "delimited_lm")
  assert (aligned.autoregressive, aligned.model_type) == (False, "aligned")
  assert model_graph.model_features(delimited, ["inputs", "targets", "weights"]) == [
      "inputs", "targets"]


def test_delimited_lm_trains_on_the_text2self_sequences(trained):
  run = trained["delimited_lm"]
  batch = toy_batch("train")
  delimited = restored_graph(run, "delimited_lm", ["inputs", "targets"],
                             {"inputs": IN_LEN, "targets": TG_LEN})(batch)
  expected = text2self(batch["inputs"], batch["targets"])
  np.testing.assert_array_equal(delimited["targets"], expected)
  # The same weights as a plain "lm" on the numpy sequences give the same loss:
  # training saw exactly those sequences.
  lm = restored_graph(run, "lm", ["targets"], IN_LEN + TG_LEN)({"targets": expected})
  np.testing.assert_allclose(delimited["loss"], lm["loss"], rtol=1e-6)
  # Metrics and scores count the targets part only: after the first EOS, not padding.
  first_eos = (expected == 1).argmax(-1)[:, None]
  positions = np.arange(expected.shape[1])[None, :]
  np.testing.assert_array_equal(delimited["weights"],
                                (positions > first_eos) & (expected > 0))
  # Eval perplexity is exp of the mean cross-entropy over those positions only (the
  # original's neg_log_perplexity), not of the loss over the whole sequence.
  xent = -np.take_along_axis(log_softmax(delimited["logits"].astype(np.float64)),
                             expected[..., None], -1)[..., 0]
  np.testing.assert_allclose(delimited["xent_sum"], (xent * delimited["weights"]).sum(),
                             rtol=1e-5)
  assert delimited["counted"] == delimited["weights"].sum()
  assert abs(delimited["xent_sum"] / delimited["counted"] - delimited["loss"]) > 1e-3


def test_delimited_lm_decodes_and_scores_the_continuation(trained, tmp_path):
  run = trained["delimited_lm"]
  prompts = ["abc", "fed", "ab", "cafe"]
  prompt_ids = [list(VOCAB.encode(p)) + [1] for p in prompts]  # "inputs EOS"
  gin.clear_config()
  try:
    gin_setup.parse_gin([], run["params"])
    lm = utils.get_estimator("lm", VOCAB, "", "", run["model_dir"], BATCH,
                             IN_LEN + TG_LEN, True, 0.01, 2, 2, None, None, None, None,
                             False, None, 2, None)
    expected = decode_checks.greedy_lm_decode(lm, prompt_ids, IN_LEN + TG_LEN,
                                              VOCAB.vocab_size)
    lm_logits = decode_checks.model_logits(
        lm, {"targets": text2self(toy_batch()["inputs"], toy_batch()["targets"])})
  finally:
    gin.clear_config()
  # The reference keeps 0 at the prompt positions: only the continuation is output.
  for row, ids in zip(expected, prompt_ids):
    assert not row[:len(ids)].any()
  assert any(decode_io.ids_to_text(row, VOCAB) for row in expected), (
      "all-empty continuations would not tell decodes apart")
  prompt_file = tmp_path / "prompts.txt"
  prompt_file.write_text("".join(p + "\n" for p in prompts))
  lines = trainer_helpers.run_with(run["params"], mode="decode",
                                   decode_input_file=str(prompt_file),
                                   decode_output_file=str(tmp_path / "out.txt"))
  assert lines == [decode_io.ids_to_text(row, VOCAB) for row in expected]
  assert open(tmp_path / "out.txt").read() == "".join(l + "\n" for l in lines)
  # The export takes the prompt text and puts EOS after it, as decode mode does.
  export_path = trainer_helpers.run_with(run["params"], mode="export",
                                         export_path=str(tmp_path / "export"))
  served = tf.saved_model.load(export_path).signatures["serving_default"](
      input=tf.constant(prompts))
  assert [t.decode() for t in served["outputs"].numpy()] == lines

  # Scoring (the estimator's, as score_from_strings runs it): log p(targets | inputs).
  gin.clear_config()
  try:
    gin_setup.parse_gin([], run["params"])
    estimator = utils.get_estimator(
        "delimited_lm", VOCAB, "", "", run["model_dir"], BATCH,
        {"inputs": IN_LEN, "targets": TG_LEN}, True, 0.01, 2, 2, None, None, None,
        None, False, None, 2, None)
    batch = toy_batch()
    rows = list(estimator.score(
        lambda params: tf.data.Dataset.from_tensors(batch)))
  finally:
    gin.clear_config()
  sequences = text2self(batch["inputs"], batch["targets"])
  token_scores = np.take_along_axis(log_softmax(lm_logits), sequences[..., None],
                                     -1)[..., 0]
  after_first_eos = np.cumsum(sequences == 1, axis=-1) - (sequences == 1) > 0
  expected_scores = (token_scores * (after_first_eos & (sequences > 0))).sum(-1)
  np.testing.assert_allclose([r["scores"] for r in rows], expected_scores, rtol=1e-5)


def test_aligned_is_not_autoregressive_and_scores_targets_given_inputs(trained):
  run = trained["aligned"]
  forward = restored_graph(run, "aligned", ["inputs", "targets"],
                           {"inputs": IN_LEN, "targets": TG_LEN})
  batch = toy_batch()
  base = forward(batch)
  later_input = {k: v.copy() for k, v in batch.items()}
  later_input["inputs"][:, -1] = FIRST_TOKEN + 2
  changed = forward(later_input)
  # Position 0 reads the last input position: the model attends both ways.
  assert np.abs(changed["logits"][:, 0] - base["logits"][:, 0]).max() > 1e-4
  # The logits read the inputs only; the targets only change the loss.
  other_targets = {"inputs": batch["inputs"], "targets": np.roll(batch["targets"], 1, 0)}
  swapped = forward(other_targets)
  np.testing.assert_array_equal(swapped["logits"], base["logits"])
  for features, out in ((batch, base), (other_targets, swapped)):
    targets = features["targets"]
    xent = -np.take_along_axis(log_softmax(out["logits"].astype(np.float64)),
                               targets[..., None], -1)[..., 0]
    # The model's loss: summed over non-padding targets, over batch * length.
    np.testing.assert_allclose(out["loss"], (xent * (targets > 0)).sum() / targets.size,
                               rtol=1e-5)
  assert abs(swapped["loss"] - base["loss"]) > 1e-3
  # Eval mode runs (token accuracy over the non-padding targets).
  results = trainer_helpers.run_with(run["params"], mode="eval",
                                     eval_dataset_fn=toy_text2text,
                                     dataset_split="validation")
  assert results["batches"] == 2 and 0.0 <= results["token_accuracy"] <= 1.0


@pytest.mark.parametrize("mode", ["decode", "export"])
def test_aligned_refuses_decoding_modes(trained, mode):
  with pytest.raises(MtfError, match=r"model_type 'aligned' cannot run mode '%s'" % mode):
    trainer_helpers.run_with(trained["aligned"]["params"], mode=mode)


def test_aligned_refuses_unequal_lengths(trained, tmp_path):
  params = trained["aligned"]["params"] + [
      "utils.run.model_dir = %r" % str(tmp_path / "m"),
      "utils.run.sequence_length = {'inputs': 6, 'targets': 4}"]
  with pytest.raises(MtfError, match=r"model_type 'aligned' needs inputs and targets "
                     r"of one length"):
    trainer_helpers.run_with(params, train_dataset_fn=toy_text2text)
  assert not os.path.exists(tmp_path / "m" / "checkpoint")
