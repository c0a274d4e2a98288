"""The original's call sequence on the TF 2 trainer: get_estimator -> train_model ->
eval_model -> infer_model / score_from_strings / compute_log_likelihoods ->
export_model, on the byte LM and on the reverse-tokens encoder-decoder (toy sizes)."""
import functools
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

import trainer_helpers
from decode_checks import assert_greedy_lm_continuations
from decode_checks import teacher_forced_log_probs
from mesh_tf.errors import MtfError
from models.transformer import dataset as dataset_lib
from models.transformer.trainer import gin_setup
from models.transformer import synthetic_tasks
from models.transformer import utils
from models.transformer.vocabulary import ByteVocabulary

TINY = ["num_layers = 1", "d_model = 16", "d_ff = 32", "num_heads = 4", "d_kv = 4",
        "dropout_rate = 0.0", "Unitransformer.max_length = 16"]


@pytest.fixture(autouse=True)
def _seeded():
  """Initial weights independent of the tests run before in this process: decodes of
  these barely trained models have near-tied logits, which other weights may flip."""
  tf.random.set_seed(0)


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

  # Scores: an LM scores the target after "input EOS"; each equals the sum of the
  # log-softmax of the logits at the target positions, computed here in numpy.
  scores, targets = utils.score_from_strings(
      estimator, vocab, "lm", 4, 16, str(model_dir), None, inputs=["the", "a"],
      targets=[" cat", " dog sat"], score_postprocess_fn=utils.save_scores)
  ids, weights = utils.encode_delimited_lm(["the", "a"], [" cat", " dog sat"], vocab, 4,
                                           16)
  assert weights[0].sum() == len(" cat") + 1 and weights[1].sum() == len(" dog sat") + 1
  assert targets == ["the", "a"]  # the texts of the scored rows, up to their first EOS
  np.testing.assert_allclose(
      scores, teacher_forced_log_probs(estimator, {"targets": ids}, weights)[:2],
      rtol=1e-4)
  full = utils.compute_log_likelihoods(
      estimator, lambda params: tf.data.Dataset.from_tensor_slices(
          {"targets": ids}).batch(4))
  np.testing.assert_allclose(
      full, teacher_forced_log_probs(estimator, {"targets": ids}, ids != 0), rtol=1e-4)

  # The export's default signature takes strings (the original's key "input") and
  # returns strings; it decodes what decode_from_file decoded for the same prompts.
  exported = utils.export_model(estimator, str(tmp_path / "export"), vocab, 16, "lm")
  loaded = tf.saved_model.load(exported)
  served = loaded.signatures["serving_default"](input=tf.constant(["the cat", "the dog"]))
  assert [t.decode() for t in served["inputs"].numpy()] == ["the cat", "the dog"]
  assert [t.decode("utf-8", "ignore") for t in served["outputs"].numpy()] == outputs[0]
  prompt_ids = utils.encode_inputs(["the cat", "the dog"], vocab, "lm", 2, 16)
  by_ids = loaded.signatures["ids"](ids=tf.constant(prompt_ids))["outputs"].numpy()
  assert [vocab.decode(row) for row in by_ids] == outputs[0]
  assert any(outputs[0])  # something was decoded
  # ... and that is the greedy continuation under the model's own logits.
  assert_greedy_lm_continuations(estimator, [vocab.encode(p) for p in ("the cat",
                                                                       "the dog")],
                                 by_ids, vocab.vocab_size)


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


# --- Scoring and decoding from T5-style datasets (lists of EvalDatasets) -------------

_PAIRS = [("abc", "cba"), ("hello", "olleh"), ("xy", "yx"), ("mesh", "hsem"),
          ("tf two", "owt ft")]
_BI_LENGTHS = {"inputs": 8, "targets": 8}


def _reverse_fn(sequence_length, vocabulary, dataset_split):
  return synthetic_tasks.synthetic_reverse_dataset(sequence_length, vocabulary,
                                                   dataset_split, num_tokens=6)


def _ids(text, length=8):
  ids = ByteVocabulary().encode(text) + [1]
  return ids + [0] * (length - len(ids))


def t5_style_dataset_fn(sequence_length, vocabulary, dataset_split, pairs=None,
                        name="reverse", postprocess_fn=None):
  """What T5's mesh_eval_dataset_fn returns: a list of EvalDatasets whose dataset_fn
  yields padded int features plus the "*_pretokenized" strings."""
  del vocabulary, dataset_split
  pairs = pairs or _PAIRS

  def dataset_fn():
    return tf.data.Dataset.from_tensor_slices({
        "inputs": np.array([_ids(i, sequence_length["inputs"]) for i, _ in pairs],
                           np.int64),
        "targets": np.array([_ids(t, sequence_length["targets"]) for _, t in pairs],
                            np.int64),
        "inputs_pretokenized": [i for i, _ in pairs],
        "targets_pretokenized": [t for _, t in pairs]})
  return [dataset_lib.EvalDataset(name, dataset_fn, postprocess_fn, [])]


@pytest.fixture(scope="module")
def trained_bi(tmp_path_factory):
  gin.clear_config()
  gin_setup.parse_gin([], TINY)
  model_dir = tmp_path_factory.mktemp("bi_scored")
  tf.random.set_seed(0)
  estimator = _estimator("bitransformer", model_dir, _BI_LENGTHS)
  utils.train_model(estimator, ByteVocabulary(), _BI_LENGTHS, 4, _reverse_fn, 3, None)
  yield estimator
  gin.clear_config()


@pytest.fixture
def bi(trained_bi):
  gin.clear_config()  # other tests of this file clear gin; the model needs TINY's
  gin_setup.parse_gin([], TINY)
  yield trained_bi
  gin.clear_config()


def _pair_features(pairs, batch_size=4):
  """{"inputs", "targets"} int32 arrays of pairs, padded with zero rows to batches."""
  rows = len(pairs) + (-len(pairs) % batch_size)
  out = {k: np.zeros([rows, 8], np.int32) for k in ("inputs", "targets")}
  for n, (i, t) in enumerate(pairs):
    out["inputs"][n], out["targets"][n] = _ids(i), _ids(t)
  return out


def test_score_from_dataset_takes_what_t5_passes(bi, tmp_path):
  # T5's MtfModel.score(mixture_or_task_name=...) passes
  # functools.partial(mesh_eval_dataset_fn, mixture_or_task_name=...), which returns a
  # list of EvalDatasets, and save_scores with a scores_filename.
  vocab = ByteVocabulary()
  scores_file = str(tmp_path / "scores")
  scores, inputs, targets = utils.score_from_dataset(
      bi, vocab, 4, _BI_LENGTHS, bi.model_dir, None, "validation",
      score_dataset_fn=t5_style_dataset_fn,
      score_postprocess_fn=functools.partial(utils.save_scores,
                                             scores_filename=scores_file))
  assert inputs == [i for i, _ in _PAIRS] and targets == [t for _, t in _PAIRS]
  features = _pair_features(_PAIRS)
  expected = teacher_forced_log_probs(bi, features, features["targets"] != 0)
  np.testing.assert_allclose(scores, expected[:len(_PAIRS)], rtol=1e-4)
  assert len(set(np.round(scores, 4))) == len(_PAIRS)  # distinct: really per example
  written = [float(x) for x in open(scores_file + ".scores").read().split()]
  np.testing.assert_allclose(written, scores, rtol=1e-6)
  assert open(scores_file + ".lengths").read().split() == [
      str(len(t) + 1) for _, t in _PAIRS]
  # Two datasets are scored one after the other, as the original concatenates them.
  two = utils.score_from_dataset(
      bi, vocab, 4, _BI_LENGTHS, bi.model_dir, None, "validation",
      score_dataset_fn=lambda **kw: (t5_style_dataset_fn(**kw, pairs=_PAIRS[:2])
                                     + t5_style_dataset_fn(**kw, pairs=_PAIRS[3:])),
      score_postprocess_fn=functools.partial(utils.save_scores,
                                             save_example_text=False))
  np.testing.assert_allclose(two, scores[:2] + scores[3:], rtol=1e-5)


def test_score_with_estimator_lazy_writes_tfrecord_shards(bi, tmp_path):
  vocab = ByteVocabulary()
  features = _pair_features(_PAIRS)
  input_fn = lambda params: tf.data.Dataset.from_tensor_slices(features).batch(4)
  eager = utils.score_with_estimator(bi, input_fn, None, bi.model_dir, vocab,
                                     utils.save_scores)
  prefix = str(tmp_path / "lazy" / "scores")
  paths = utils.score_with_estimator_lazy(
      bi, input_fn, None, bi.model_dir, vocab,
      score_postprocess_fn=functools.partial(utils.save_scores_to_tfrecords,
                                             scores_filename=prefix),
      num_examples=len(_PAIRS), num_examples_per_shard=2)
  assert paths == ["%s_%d.tfrecord" % (prefix, i) for i in range(3)]
  records = []
  for path in paths:
    for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
      example = tf.train.Example.FromString(raw).features.feature
      records.append((example["input"].bytes_list.value[0].decode(),
                      example["target"].bytes_list.value[0].decode(),
                      example["score"].float_list.value[0]))
  assert [r[:2] for r in records] == _PAIRS
  scores, inputs, targets = eager
  assert inputs == [i for i, _ in _PAIRS] and targets == [t for _, t in _PAIRS]
  np.testing.assert_allclose([r[2] for r in records], scores, rtol=1e-6)


def test_save_scores_to_tfrecords_save_ids_only(tmp_path):
  vocab = ByteVocabulary()
  results = [{"inputs": np.array(_ids("ex7 abc", 12)), "targets": np.array(_ids("cba")),
              "scores": -1.25},
             {"targets": np.array(_ids("zz")), "scores": -2.5}]
  path = utils.save_scores_to_tfrecords(results, vocab, str(tmp_path / "s"), shard_idx=4,
                                        save_ids_only=True)
  assert path == str(tmp_path / "s_4.tfrecord")
  got = []
  for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
    feature = tf.train.Example.FromString(raw).features.feature
    got.append((feature["input"].bytes_list.value[0], feature["target"].bytes_list.value[0],
                feature["score"].float_list.value[0]))
  assert got == [(b"ex7", b"cba", -1.25), (b"", b"zz", -2.5)]


def test_decode_from_dataset_writes_what_decode_from_file_decodes(bi, tmp_path):
  vocab = ByteVocabulary()
  out_dir = tmp_path / "decoded"
  decodes = utils.decode_from_dataset(
      bi, vocab, "bitransformer", 4, _BI_LENGTHS,
      infer_dataset_fn=lambda **kw: (
          t5_style_dataset_fn(**kw, pairs=_PAIRS[:3], name="first")
          + t5_style_dataset_fn(**kw, pairs=_PAIRS[3:], name="second",
                                postprocess_fn=str.upper)),
      dataset_split="validation", decode_output_dir=str(out_dir))
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("".join(i + "\n" for i, _ in _PAIRS))
  expected = utils.decode_from_file(bi, vocab, "bitransformer", 4, _BI_LENGTHS,
                                    input_filename=str(prompts),
                                    output_filename=str(tmp_path / "file"))
  assert decodes == expected and len(decodes) == len(_PAIRS)
  step = int(bi.latest_checkpoint().rsplit("-", 1)[1])

  def lines(name):
    return (out_dir / name).read_text().split("\n")[:-1]
  assert lines("first_%d_predictions" % step) == expected[:3]
  assert lines("second_%d_predictions" % step) == expected[3:]
  assert lines("first_inputs") == [i for i, _ in _PAIRS[:3]]
  assert lines("first_targets") == [t for _, t in _PAIRS[:3]]
  assert lines("second_targets") == [t.upper() for _, t in _PAIRS[3:]]
