"""Helpers of the original's transformer API with the original's parameters and meaning:
utils (tpu_mesh_shape, compute_batch_size, vocabulary pairs, eval metrics, variable
filters, microbatches), the transformer learning_rate_schedules module and
make_layer_stack's [cls, "name", {kwargs}] entries."""
import math

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.trainer import gin_setup
from models.transformer import learning_rate_schedules
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer import utils
from models.transformer import vocabulary
from test_layer_stack import _setup  # pylint: disable=g-bad-import-order


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


def _dims(shape):
  return [(d.name, d.size) for d in shape.dims]


def test_tpu_mesh_shape_slice_names_and_size_one_dims():
  assert _dims(utils.tpu_mesh_shape("v2-8", 8)) == [("model", 8)]
  assert _dims(utils.tpu_mesh_shape("v3-8", 1)) == [("batch", 8)]
  assert _dims(utils.tpu_mesh_shape("v3-512", 16)) == [("batch", 32), ("model", 16)]
  assert _dims(utils.tpu_mesh_shape("2x2", 8)) == [("model", 8)]
  assert _dims(utils.tpu_mesh_shape("4x4_twisted", 4)) == [("batch", 8), ("model", 4)]
  assert _dims(utils.tpu_mesh_shape("v2-8", 2, ensemble_parallelism=4)) == [
      ("ensemble", 4), ("model", 2)]
  assert utils.tpu_mesh_shape("v2-8", 8).size == 8
  # A list model_parallelism is a HierarchicalTiling spec: None takes what is left.
  assert _dims(utils.tpu_mesh_shape("v3-32", [("batch", None), ("model", [2, 4])])) == [
      ("batch", 4), ("model", 8)]
  with pytest.raises(mtf.MtfError, match="tpu_topology 'tpu'"):
    utils.tpu_mesh_shape("tpu", 1)


@pytest.mark.parametrize("method_and_value,mesh,layout,want", [
    (("sequences_per_batch", 6), "a:2;b:4", "batch:a", 6),
    (("tokens_per_batch", 2048), "a:2;b:4", "batch:a", 2048 // 128),
    (("sequences_per_replica", 3), "a:2;b:4", "batch:b", 3 * 4),
    (("tokens_per_replica", 512), "a:2;b:4", "batch:a", 512 // 128 * 2),
    (("tokens_per_replica", 512), "a:2;b:4", "d_ff:a", 512 // 128),
])
def test_compute_batch_size_counts_targets_tokens_per_replica(method_and_value, mesh,
                                                              layout, want):
  length = {"inputs": 512, "targets": 128}  # the targets length counts
  assert utils.compute_batch_size(length, mesh, layout, method_and_value) == want
  assert utils.compute_batch_size(128, mesh, layout, method_and_value) == want


def test_compute_batch_size_refuses_partial_sequences_and_unknown_methods():
  with pytest.raises(mtf.MtfError, match="100 tokens is not a whole number"):
    utils.compute_batch_size(64, "a:2", "batch:a", ("tokens_per_batch", 100))
  with pytest.raises(mtf.MtfError, match="unknown batch size method 'tokens'"):
    utils.compute_batch_size(64, "a:2", "batch:a", ("tokens", 128))


def test_vocabulary_pairs():
  inputs, targets = vocabulary.ByteVocabulary(), vocabulary.ByteVocabulary(extra_ids=3)
  assert utils.separate_vocabularies(inputs="I", targets="T") == ("I", "T")
  pair = utils.separate_vocabularies(inputs=inputs, targets=targets)
  assert utils.inputs_vocabulary(pair) is inputs
  assert utils.targets_vocabulary(pair) is targets
  assert utils.inputs_vocabulary(inputs) is inputs
  assert utils.targets_vocabulary(targets) is targets


def test_metric_max_and_sum_accumulate_like_tf1_metrics():
  values = tf.constant([[1.0, -4.0], [3.5, 2.0]])
  value, update = utils.metric_max(values, name="m")
  assert float(update) == 3.5 and float(value) == 3.5
  value, update = utils.metric_sum(values, weights=None)
  assert float(update) == pytest.approx(2.5) and float(value) == pytest.approx(2.5)
  # A running max starts at 0, as the original's accumulator does.
  value, _ = utils.metric_max(tf.constant([-2.0, -1.0]))
  assert float(value) == 0.0


def test_variable_filters_and_checkpoint_name_hooks():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  small = mtf.get_variable(mesh, "small", [mtf.Dimension("a", 10)])
  big = mtf.get_variable(mesh, "big", [mtf.Dimension("a", 10), mtf.Dimension("b", 20)])
  small_var, big_var = (t.operation for t in (small, big))
  assert utils.variable_filter_max_size(small_var, max_size=100)
  assert not utils.variable_filter_max_size(big_var, max_size=100)
  assert utils.variable_filter_max_size(big_var)  # default 1e7
  assert utils.init_checkpoint_variable_mapping("decoder/x") == "decoder/x"
  assert utils.init_checkpoint_variable_mapping(
      "decoder/x", mapping_fn=lambda n: n.replace("decoder", "encoder")) == "encoder/x"
  assert utils.should_load_variable("anything")
  assert not utils.should_load_variable("adam/m", filter_fn=lambda n: "adam" not in n)


def test_serialize_num_microbatches():
  batch = mtf.Dimension("batch", 32)
  length = {"inputs": 128, "targets": 256}
  assert utils.serialize_num_microbatches(batch, length, "a:2", "batch:a") == 1
  # 16 sequences per replica; 1024 tokens / 256 = 4 sequences per microbatch.
  assert utils.serialize_num_microbatches(batch, length, "a:2", "batch:a", 1024) == 4
  # 3 sequences do not divide 16: the microbatch shrinks to 2.
  assert utils.serialize_num_microbatches(batch, length, "a:2", "batch:a", 768) == 8


def test_transformer_learning_rate_schedules_module():
  lrs = learning_rate_schedules
  assert lrs.learning_rate_schedule_noam is mtf.learning_rate_schedules.\
      learning_rate_schedule_noam
  total = 1000
  for step in (0, 50, 400, 950):
    want = 1 / math.sqrt(max(step, 100)) * min(1.0, (total - step) / (total * 0.1))
    got = float(lrs.learning_rate_schedule_noam(step, total, warmup_steps=100))
    assert got == pytest.approx(want, rel=1e-6)
  assert float(lrs.constant_learning_rate(7, total, learning_rate=0.25)) == 0.25
  assert float(lrs.linear_warmup(25, total, steps_or_fraction=100)) == pytest.approx(0.25)
  # The original's gin import line and selector resolve to these functions.
  gin_setup.import_configurables()
  with gin.unlock_config():
    gin.parse_config("learning_rate_schedules.constant_learning_rate.learning_rate = 0.5")
  assert float(lrs.constant_learning_rate(3, total)) == 0.5


def test_make_layer_stack_accepts_named_entries_with_kwargs():
  graph, _, x, _, context = _setup()
  stack = transformer.make_layer_stack(
      layers=[[transformer_layers.DenseReluDense, "ffn", {"hidden_size": 6}],
              (transformer_layers.DenseReluDense, "ffn2"),
              transformer_layers.DenseReluDense],
      num_layers=2)
  assert [l.name for l in stack.layers] == [
      "block_000/ffn", "block_000/ffn2", "block_000/layer_002",
      "block_001/ffn", "block_001/ffn2", "block_001/layer_002"]
  assert stack.layers[0].hidden_size == 6 and stack.layers[1].hidden_size == 4096
  assert stack.layers[0] is not stack.layers[3]
  flat = transformer.make_layer_stack(
      layers=[[transformer_layers.DenseReluDense, "ffn", {"hidden_size": 6}],
              transformer_layers.DenseReluDense], num_layers=2, block_scope=False)
  assert [l.name for l in flat.layers] == ["ffn", "layer_001", "ffn", "layer_003"]
  stack = transformer.make_layer_stack(
      layers=[[transformer_layers.DenseReluDense, "ffn", {"hidden_size": 6}]],
      num_layers=1)
  stack.call(context, x)
  shapes = {v.name: v.outputs[0].shape.to_integer_list for v in graph.all_variables}
  assert shapes["block_000/ffn/DenseReluDense/wi/kernel"] == [4, 6]
  with pytest.raises(mtf.MtfError, match="cls, \"name\""):
    transformer.make_layer_stack(layers=[[transformer_layers.DenseReluDense]])


def test_make_layer_stack_named_entries_from_gin():
  gin_setup.import_configurables()
  with gin.unlock_config():
    gin.parse_config("""
        transformer.make_layer_stack.layers = [
            [@transformer_layers.SelfAttention, "att", {"num_heads": 2}],
            [@transformer_layers.DenseReluDense, "ffn"]]
        transformer.make_layer_stack.num_layers = 1
        DenseReluDense.hidden_size = 12""")
  stack = transformer.make_layer_stack()
  assert [l.name for l in stack.layers] == ["block_000/att", "block_000/ffn"]
  assert stack.layers[0].num_heads == 2 and stack.layers[1].hidden_size == 12
  np.testing.assert_equal(type(stack.layers[0]).__name__, "SelfAttention")


def test_get_checkpoint_iterator_picks_steps_as_the_original(tmp_path):
  for step in (100, 200, 300):
    (tmp_path / ("model.ckpt-%d.index" % step)).write_text("")
    (tmp_path / ("model.ckpt-%d.data-00000-of-00001" % step)).write_text("")
  (tmp_path / "model.ckpt-250.data-00000-of-00001").write_text("")  # no index: incomplete
  (tmp_path / "model.ckpt-400.index").write_text("")  # no data: incomplete
  model_dir = str(tmp_path)

  def steps(paths):
    return [utils.get_step_from_checkpoint_path(p) for p in paths]
  assert steps(utils.get_checkpoint_iterator(200, model_dir)) == [200]
  assert steps(utils.get_checkpoint_iterator(240, model_dir)) == [200]  # the closest
  assert steps(utils.get_checkpoint_iterator([90, 260, 300], model_dir)) == [100, 300, 300]
  assert utils.get_checkpoint_iterator(240, model_dir, find_closest=False) == [
      str(tmp_path / "model.ckpt-240")]
  assert steps(utils.get_checkpoint_iterator(None, model_dir)) == [300]
  assert utils.get_checkpoint_iterator(None, model_dir, skip_until=300) == []
  # "all": in step order after skip_until, ending at the first one >= stop_after.
  assert steps(utils.get_checkpoint_iterator("all", model_dir, skip_until=100,
                                             stop_after=250)) == [200, 300]
  with pytest.raises(mtf.MtfError, match="no checkpoint model.ckpt-N in"):
    utils.get_checkpoint_iterator(5, str(tmp_path / "empty"))


def test_parse_gin_defaults_and_flags_reads_the_trainer_flags(tmp_path):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from models.transformer import main  # pylint: disable=g-import-not-at-top,unused-import
  (tmp_path / "defaults.gin").write_text("utils.run.train_steps = 3\n"
                                         "utils.run.iterations_per_loop = 5\n")
  (tmp_path / "mine.gin").write_text("utils.run.train_steps = 4\n")
  flag_values = flags.FLAGS
  flag_values(["prog", "--gin_location_prefix=%s" % tmp_path, "--gin_file=mine.gin",
               "--gin_param=utils.run.save_checkpoints_steps = 6",
               "--gin_param=nowhere.unknown = 1"])
  try:
    with pytest.raises(mtf.MtfError, match="nowhere"):
      utils.parse_gin_defaults_and_flags()
    gin.clear_config()
    utils.parse_gin_defaults_and_flags(skip_unknown=True)
    assert gin.config_is_locked()
    assert gin.query_parameter("utils.run.train_steps") == 4  # the file after defaults
    assert gin.query_parameter("utils.run.iterations_per_loop") == 5
    assert gin.query_parameter("utils.run.save_checkpoints_steps") == 6
  finally:
    flag_values.unparse_flags()


def test_decoding_methods_take_their_options_from_gin(monkeypatch):
  """`Bitransformer.decode.beam_size = ...` and the Unitransformer.sample_autoregressive
  / beam_search bindings of the original's gin files reach the decoding functions."""
  from models.transformer import decoding  # pylint: disable=g-import-not-at-top
  gin_setup.import_configurables()
  with gin.unlock_config():
    gin.parse_config("Bitransformer.decode.beam_size = 3\n"
                     "Bitransformer.decode.alpha = 0.25\n"
                     "Unitransformer.sample_autoregressive.sampling_keep_top_k = 5\n"
                     "Unitransformer.beam_search.alpha = 0.5")
  seen = {}
  monkeypatch.setattr(decoding, "bitransformer_decode",
                      lambda model, inputs, **kw: seen.update(decode=kw))
  monkeypatch.setattr(decoding, "sample_autoregressive",
                      lambda model, ids, **kw: seen.update(sample=kw))
  monkeypatch.setattr(decoding, "beam_search",
                      lambda model, ids, length, **kw: seen.update(beam=kw))
  transformer.Bitransformer(None, None).decode("inputs", temperature=0.5)
  uni = transformer.Unitransformer(layer_stack=None)
  uni.sample_autoregressive("ids")
  uni.beam_search("ids", 4)
  assert (seen["decode"]["beam_size"], seen["decode"]["alpha"],
          seen["decode"]["temperature"]) == (3, 0.25, 0.5)
  assert seen["sample"]["sampling_keep_top_k"] == 5
  assert seen["beam"]["alpha"] == 0.5
