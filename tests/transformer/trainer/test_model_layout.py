"""One owner of layout: the model reads the MeshLayout of the MeshImpl that lowers it
(the trainer and get_estimator hand it over), its layout/mesh_shape are views of it,
and lowering a model on a MeshImpl of another layout is refused, naming both."""
import gin
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
import trainer_helpers
from mesh_tf.errors import LayoutError
from mesh_tf.shapes import MeshLayout
from models.transformer import model_graph, model_layout, transformer
from models.transformer.trainer import gin_setup
from models.transformer import transformer_layers, utils
from models.transformer.context import Context, ModeKeys
from models.transformer.vocabulary import ByteVocabulary

MESH, RULES = "rows:2;cols:4", "batch:rows;heads:cols"


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


def _lm(layout=None, mesh_shape=None, name="transformer"):
  layers = [transformer_layers.SelfAttention(num_heads=4, key_value_size=4),
            transformer_layers.DenseReluDense(hidden_size=8)]
  for i, layer in enumerate(layers):
    layer.set_name("block_000/layer_%03d" % i)
  return transformer.Unitransformer(
      layer_stack=transformer.LayerStack(layers), d_model=8, input_vocab_size=16,
      output_vocab_size=16, autoregressive=True, max_length=8, vocab_divisor=8,
      layout=layout, mesh_shape=mesh_shape, name=name)


def _graph(model):
  return model_graph.ModelGraph(model, 4, 8, ["targets"], ModeKeys.EVAL,
                                mtf.VariableDType(tf.float32))


def test_pair_becomes_one_mesh_layout_and_the_attributes_are_its_views():
  model = _lm(layout=RULES, mesh_shape=MESH)
  assert model.mesh_layout == MeshLayout(MESH, RULES)
  assert model.layout is model.mesh_layout.layout_rules
  assert model.mesh_shape is model.mesh_layout.shape
  impl = mtf_testing.backend_mesh_impl("placement", MESH, RULES)
  shared = _lm(layout=impl.mesh_layout)
  assert shared.mesh_layout is impl.mesh_layout
  context = Context(shared, None, [], None, None)
  assert context.mesh_layout is impl.mesh_layout


@pytest.mark.parametrize("layout,mesh_shape", [(None, None), (RULES, None), (None, MESH)])
def test_without_both_halves_the_model_has_no_layout(layout, mesh_shape):
  model = _lm(layout=layout, mesh_shape=mesh_shape)
  assert model.mesh_layout is None and model.layout is None and model.mesh_shape is None


def test_a_mesh_layout_with_another_mesh_shape_is_refused():
  with pytest.raises(LayoutError, match="mesh_shape rows:8 disagrees.*rows:2;cols:4"):
    model_layout.mesh_layout_of(MeshLayout(MESH, RULES), "rows:8")


def test_split_size_reads_the_layout():
  layout = MeshLayout(MESH, RULES)
  assert model_layout.split_size(layout, "batch") == 2
  assert model_layout.split_size(layout, mtf.Dimension("heads", 8)) == 4
  assert model_layout.split_size(layout, "d_ff") == 1
  assert model_layout.split_size(None, "batch") == 1


@pytest.mark.parametrize("impl_mesh,impl_rules", [
    (MESH, "batch:rows"),             # other rules
    ("rows:4;cols:2", RULES),         # other mesh shape
])
def test_lowering_on_a_mesh_impl_of_another_layout_names_both(impl_mesh, impl_rules):
  graph = _graph(_lm(layout=RULES, mesh_shape=MESH))
  impl = mtf_testing.backend_mesh_impl("simd", impl_mesh, impl_rules)
  with pytest.raises(LayoutError) as err:
    graph.lowering(impl)
  text = str(err.value)
  assert "'transformer' was built for mesh shape %r and layout %r" % (MESH, RULES) in text
  assert "SimdMeshImpl lowering it has mesh shape %r and layout %r" % (
      str(impl.shape.to_string), str(impl.layout_rules)) in text


def test_bitransformer_parts_are_checked_too():
  model = transformer.Bitransformer(_lm(RULES, MESH, "encoder"),
                                    _lm(RULES, MESH, "decoder"))
  impl = mtf_testing.backend_mesh_impl("simd", MESH, "batch:rows")
  with pytest.raises(LayoutError, match="'encoder' was built for"):
    model_layout.check_agrees(model, impl)


def test_agreeing_layouts_lower_and_rule_order_does_not_matter():
  impl = mtf_testing.backend_mesh_impl("simd", MESH, "heads:cols;batch:rows")
  graph = _graph(_lm(layout=RULES, mesh_shape=MESH))
  lowering = graph.lowering(impl, {"targets": tf.ones([4, 8], tf.int32)})
  assert lowering.export_to_tf_tensor(graph.loss).shape == ()
  model_layout.check_agrees(_lm(), impl)  # a model without a layout agrees with any


def test_trainer_gives_the_model_the_mesh_impls_own_layout(tmp_path, monkeypatch):
  from models.transformer.trainer import train_loop  # pylint: disable=g-import-not-at-top
  seen = {}

  def fake_run_train(config, mesh_impl):
    seen["model"], seen["mesh_impl"] = config.model_fn(), mesh_impl
  monkeypatch.setattr(train_loop, "run_train", fake_run_train)
  corpus = trainer_helpers.write_corpus(tmp_path)
  trainer_helpers.run_with(trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus) + [
      "make_mesh_impl.backend = 'simd'", "utils.run.mesh_shape = 'b:2;m:4'",
      "utils.run.layout_rules = 'batch:b;heads:m'", "utils.run.model_type = 'lm'"])
  impl = seen["mesh_impl"]
  assert impl.mesh_layout == MeshLayout("b:2;m:4", "batch:b;heads:m")
  assert seen["model"].mesh_layout is impl.mesh_layout


def test_get_estimator_gives_the_model_the_mesh_impls_own_layout(tmp_path):
  gin_setup.parse_gin([], trainer_helpers.tiny_lm_bindings(tmp_path, "")[:7])
  estimator = utils.get_estimator(
      model_type="lm", vocabulary=ByteVocabulary(), mesh_shape="b:2;m:4",
      layout_rules="batch:b", model_dir=str(tmp_path), batch_size=4, sequence_length=8,
      autostack=True, learning_rate_schedule=0.01, keep_checkpoint_max=1,
      save_checkpoints_steps=1, optimizer=None, predict_fn=None, variable_filter=None,
      ensemble_inputs=None, use_tpu=False, tpu_job_name=None, iterations_per_loop=1,
      cluster=None, mesh_devices=["/cpu:%d" % i for i in range(8)])
  assert estimator.mesh_impl.mesh_layout == MeshLayout("b:2;m:4", "batch:b")
  assert estimator.model_fn().mesh_layout is estimator.mesh_impl.mesh_layout


def test_decode_graph_is_checked_unless_built_for_any_mesh():
  from models.transformer.trainer import decode_io  # pylint: disable=g-import-not-at-top
  single = mtf.PlacementMeshImpl("", "", [""])
  dtype = mtf.VariableDType(tf.float32)
  checked = decode_io.DecodeGraph(_lm(RULES, MESH), 2, 8, dtype)
  with pytest.raises(LayoutError, match="'transformer' was built for mesh shape"):
    checked.lowering(single)
  # Export lowers the trained model's graph (built for its mesh) on one device.
  exported = decode_io.DecodeGraph(_lm(RULES, MESH), 2, 8, dtype, any_mesh=True)
  prompts = tf.constant([[3, 4, 0, 0, 0, 0, 0, 0]] * 2, tf.int32)
  ids = exported.lowering(single, prompts).export_to_tf_tensor(exported.outputs)
  assert ids.shape == (2, 8)


def test_a_model_of_the_originals_kind_is_read_through_its_attributes():
  class OriginalKindModel:
    layout, mesh_shape = RULES, MESH
  context = Context(OriginalKindModel(), None, [], None, None)
  assert context.mesh_layout == MeshLayout(MESH, RULES)
