"""The original's call sequence on the TF 2 trainer: get_estimator -> train_model ->
eval_model -> infer_model / score_from_strings / compute_log_likelihoods ->
export_model, on the byte LM and on the reverse-tokens encoder-decoder (toy sizes)."""
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

import trainer_helpers
from mesh_tf.errors import MtfError
from models.transformer import dataset as dataset_lib
from models.transformer import gin_setup
from models.transformer import synthetic_tasks
from models.transformer import utils
from models.transformer.vocabulary import ByteVocabulary

TINY = ["num_layers = 1", "d_model = 16", "d_ff = 32", "num_heads = 4", "d_kv = 4",
        "dropout_rate = 0.0", "Unitransformer.max_length = 16"]


@pytest.fixture
def tiny_gin():
  gin.clear_config()
  gin_setup.parse_gin([], TINY)
  yield
  gin.clear_config()


def _estimator(model_type, model_dir, sequence_length, mesh_shape="", layout_rules="",
               **kwargs):
  params = dict(
      model_type=model_type, vocabulary=ByteVocabulary(), mesh_shape=mesh_shape,
      layout_rules=layout_rules, model_dir=str(model_dir), batch_size=4,
      sequence_length=sequence_length, autostack=True, learning_rate_schedule=0.01,
      keep_checkpoint_max=3, save_checkpoints_steps=3, optimizer=None, predict_fn=None,
      variable_filter=None, ensemble_inputs=None, use_tpu=False, tpu_job_name=None,
      iterations_per_loop=3, cluster=None)
  params.update(kwargs)
  return utils.get_estimator(**params)


def test_lm_call_sequence(tiny_gin, tmp_path):
  vocab = ByteVocabulary()
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "lm"

  def train_dataset_fn(sequence_length, vocabulary, dataset_split):
    return dataset_lib.text_corpus_dataset(sequence_length, vocabulary, dataset_split,
                                           glob=corpus, validation_fraction=0.3)
  estimator = _estimator("lm", model_dir, 16)
  history = utils.train_model(estimator, vocab, 16, 4, train_dataset_fn, 6, None)
  assert [s for s, _ in history] == [3, 6]
  assert estimator.latest_checkpoint().endswith("model.ckpt-6")

  results = utils.eval_model(estimator, vocab, 16, 4, "validation", str(model_dir),
                             train_dataset_fn, None, [3, 6])
  assert sorted(os.path.basename(p) for p in results) == ["model.ckpt-3", "model.ckpt-6"]
  assert all(np.isfinite(r["loss"]) for r in results.values())
  assert os.path.exists(model_dir / "eval" / "eval_results-6.txt")

  prompts = tmp_path / "prompts.txt"
  prompts.write_text("the cat\nthe dog\n")
  outputs = utils.infer_model(estimator, vocab, 16, 4, "lm", str(model_dir), None,
                              decode_fn=lambda *a, **k: utils.decode_from_file(
                                  *a, input_filename=str(prompts),
                                  output_filename=str(tmp_path / "out"), **k))
  assert len(outputs) == 1 and len(outputs[0]) == 2
  written = (tmp_path / "out-6").read_text().split("\n")[:-1]
  assert written == [" ".join(d.splitlines()) for d in outputs[0]]

  # Scores: an LM scores the target after "input EOS"; scoring the whole sequence
  # (input, EOS, target) gives less.
  scores = utils.score_from_strings(
      estimator, vocab, "lm", 4, 16, str(model_dir), None, inputs=["the", "a"],
      targets=[" cat", " dog sat"], score_postprocess_fn=utils.save_scores)
  assert len(scores) == 2 and all(s < 0 for s in scores)
  ids, weights = utils.encode_delimited_lm(["the", "a"], [" cat", " dog sat"], vocab, 4,
                                           16)
  assert weights[0].sum() == len(" cat") + 1 and weights[1].sum() == len(" dog sat") + 1
  full = utils.compute_log_likelihoods(
      estimator, lambda params: tf.data.Dataset.from_tensor_slices(
          {"targets": ids}).batch(4))
  assert len(full) == 4 and all(f < s for f, s in zip(full, scores))

  exported = utils.export_model(estimator, str(tmp_path / "export"), vocab, 16, "lm")
  loaded = tf.saved_model.load(exported)
  out = loaded.signatures["text"](tf.constant(["the cat"]))["outputs"].numpy()
  assert out.shape == (1,)


def test_scores_equal_the_teacher_forced_loss_on_two_layouts(tiny_gin, tmp_path):
  vocab = ByteVocabulary()
  model_dir = tmp_path / "bi"
  lengths = {"inputs": 8, "targets": 8}

  def reverse_fn(sequence_length, vocabulary, dataset_split):
    return synthetic_tasks.synthetic_reverse_dataset(sequence_length, vocabulary,
                                                     dataset_split, num_tokens=6)
  estimator = _estimator("bitransformer", model_dir, lengths)
  utils.train_model(estimator, vocab, lengths, 4, reverse_fn, 3, None)
  batch = next(iter(reverse_fn(lengths, vocab, "validation").batch(4)))
  batch = {k: tf.cast(v, tf.int32) for k, v in batch.items() if k in ("inputs", "targets")}
  batch = {k: tf.pad(v, [[0, 0], [0, 8 - v.shape[1]]]) for k, v in batch.items()}

  def input_fn(params):
    return tf.data.Dataset.from_tensors(batch)
  single = utils.compute_log_likelihoods(estimator, input_fn)
  loss = estimator.evaluate(tf.data.Dataset.from_tensors(batch), 1)["loss"]
  # The model's loss divides the summed token losses by batch x length.
  np.testing.assert_allclose(-sum(single) / (4 * 8), loss, rtol=1e-5)
  split = _estimator("bitransformer", model_dir, lengths, mesh_shape="b:2;m:4",
                     layout_rules="batch:b;heads:m;d_ff:m;vocab:m")
  np.testing.assert_allclose(utils.compute_log_likelihoods(split, input_fn), single,
                             rtol=1e-5)
  decodes = utils.decode(estimator, input_fn, vocab)
  assert len(decodes) == 4


def test_unsupported_options_are_named(tmp_path, tiny_gin):
  with pytest.raises(MtfError, match="use_tpu, variable_filter not supported"):
    _estimator("lm", tmp_path, 16, use_tpu=True, variable_filter="x")


def test_flexible_mapping_and_microbatches():
  mapping = utils.flexible_ckpt_init_mapping(new_layers=[1])
  assert mapping("decoder/block_000/layer_000/x") == "decoder/block_000/layer_000/x"
  assert mapping("decoder/layer_001/x") is None
  assert mapping("decoder/layer_003/x") == "decoder/layer_002/x"
  assert utils.init_checkpoint_variable_mapping("a/b", lambda n: "z/" + n) == "z/a/b"
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  batch = mtf.Dimension("batch", 32)
  assert utils.serialize_num_microbatches(batch, 64, "b:2", "batch:b") == 1
  # 16 sequences x 64 tokens per replica = 1024 tokens; 300 per microbatch -> 4 (the
  # next divisor of 16 at or above ceil(1024 / 300) = 4).
  assert utils.serialize_num_microbatches(batch, 64, "b:2", "batch:b", 300) == 4
  assert utils.serialize_num_microbatches(batch, 64, "b:2", "batch:b", 200) == 8
