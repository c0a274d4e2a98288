"""transformer.PipelinedLayerStack: the loss and every gradient of a pipelined LM equal
those of the plain LayerStack with the same weights (one device, stage:2, and
stage:2,batch:2,model:2 on the placement and GSPMD backends); checkpoints hold
the plain names and shapes both ways; the trainer trains it and the plain model
evaluates its checkpoint to the same loss; bad configurations fail in one line."""
import contextlib
import io

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import trainer_helpers
from mtf_testing import backend_mesh_impl
from models.transformer import layer_stack as ls
from models.transformer import transformer, transformer_layers
from models.transformer.context import Context, ModeKeys
from models.transformer.pipelined_layer_stack import PipelinedLayerStack

BATCH, LENGTH, D_MODEL, VOCAB = 8, 4, 8, 16
_RNG = np.random.RandomState(0)
IDS = _RNG.randint(1, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
TARGETS = np.roll(IDS, 1, axis=1)
# Packed examples: the context's sequence_id and position go through the pipeline too.
SEGMENTS = np.array([[1, 1, 2, 2], [1, 1, 1, 0]] * 4, np.int32)
POSITIONS = np.array([[0, 1, 0, 1], [0, 1, 2, 0]] * 4, np.int32)
MESH_3D = ("stage:2;batch:2;model:2",
           "stages:stage;batch:batch;d_ff:model;heads:model;vocab:model")


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture(scope="module", autouse=True)
def _no_gin_bindings_for_module_fixtures():
  # module fixtures (plain, on_stage2) are made before the per-test clearing above: they
  # must not see bindings an earlier test file of this process left behind
  gin.clear_config()


def _layers():
  return [transformer_layers.SelfAttention(num_heads=2, key_value_size=4),
          transformer_layers.DenseReluDense(hidden_size=16)]


def _build(impl, blocks=2, **pipeline_kwargs):
  """(graph, mesh, loss, trainable variables, their gradients) of a 2-layers-a-block LM;
  pipelined when pipeline_kwargs are given."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  cls = (lambda layers: PipelinedLayerStack(layers, **pipeline_kwargs)
         ) if pipeline_kwargs else transformer.LayerStack
  stack = transformer.make_layer_stack(layers=_layers(), num_layers=blocks,
                                       layer_stack_cls=cls)
  model = transformer.Unitransformer(
      stack, d_model=D_MODEL, input_vocab_size=VOCAB, output_vocab_size=VOCAB,
      autoregressive=True, max_length=LENGTH, name="decoder", vocab_divisor=8,
      layout=impl.mesh_layout)
  dims = [mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)]
  imp = lambda a: mtf.import_tf_tensor(mesh, tf.constant(a), dims)
  _, loss = model.call_simple(imp(IDS), imp(TARGETS), True, mode=ModeKeys.TRAIN,
                              sequence_id=imp(SEGMENTS), position=imp(POSITIONS))
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  return graph, mesh, loss, variables, grads


def _by_plain_name(variables, values):
  """{plain LayerStack name: value}, a stacked variable split along its stages."""
  out = {}
  for v, value in zip(variables, values):
    for i, name in enumerate(getattr(v, "checkpoint_split", None) or [v.name]):
      out[name] = value[i] if getattr(v, "checkpoint_split", None) else value
  return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
  """The unpipelined LM on one device: its loss, gradients and a checkpoint."""
  impl = mtf.PlacementMeshImpl("", "", [""])
  graph, mesh, loss, variables, grads = _build(impl)
  lowering = mtf.Lowering(graph, {mesh: impl})
  path = mtf.save_checkpoint(str(tmp_path_factory.mktemp("plain")) + "/", lowering)
  values = [lowering.export_to_tf_tensor(t).numpy() for t in [loss] + grads]
  return {"loss": values[0], "grads": _by_plain_name(variables, values[1:]),
          "checkpoint": path}


def _pipelined(impl, plain_checkpoint, blocks=2, **kwargs):
  """A pipelined LM lowered on impl with the plain checkpoint's weights."""
  graph, mesh, loss, variables, grads = _build(impl, blocks=blocks, num_stages=2,
                                               num_microbatches=4, **kwargs)
  lowering = mtf.Lowering(graph, {mesh: impl})
  mtf.restore_checkpoint(plain_checkpoint, lowering)
  values = [lowering.export_to_tf_tensor(t).numpy() for t in [loss] + grads]
  return {"loss": values[0], "grads": _by_plain_name(variables, values[1:]),
          "variables": variables, "lowering": lowering}


@pytest.fixture(scope="module")
def on_stage2(plain):
  return _pipelined(backend_mesh_impl("placement", "stage:2", "stages:stage"),
                    plain["checkpoint"])


def _check_same_numbers(got, plain):
  assert sorted(got["grads"]) == sorted(plain["grads"])
  assert abs(got["loss"] - plain["loss"]) <= 1e-5, (got["loss"], plain["loss"])
  diffs = {n: np.abs(got["grads"][n] - g).max() for n, g in plain["grads"].items()}
  assert max(diffs.values()) <= 1e-5, diffs
  assert min(np.abs(g).max() for g in plain["grads"].values()) > 0  # all reach the loss


def test_stage2_loss_and_gradients_match_layer_stack(on_stage2, plain):
  _check_same_numbers(on_stage2, plain)
  stacked = [v for v in on_stage2["variables"] if getattr(v, "checkpoint_split", None)]
  assert len(stacked) == 8 and all(v.shape.dims[0] == mtf.Dimension("stages", 2)
                                   for v in stacked)
  assert "decoder/pipeline/repeat_0/layer_000/SelfAttention/q" in [
      v.name for v in stacked]


# (SIMD passes too, but its replay costs ~8 s here: see the report of issue 30 item 4.)
@pytest.mark.parametrize("backend,mesh", [("placement", MESH_3D), ("gspmd", MESH_3D)],
                         ids=["placement-3d", "gspmd-3d"])
def test_loss_and_gradients_match_layer_stack_on_backends(backend, mesh, plain):
  _check_same_numbers(_pipelined(backend_mesh_impl(backend, *mesh), plain["checkpoint"]),
                      plain)


def test_circular_schedule_with_recompute_grads_matches_layer_stack(tmp_path):
  """4 blocks on 2 stages: 2 repeats, the last stage feeding stage 0, each layer's
  forward pass recomputed in the backward pass (on one device;
  tests/layers/test_pipeline.py runs the circular schedule on split stages)."""
  impl = mtf.PlacementMeshImpl("", "", [""])
  graph, mesh, loss, variables, grads = _build(impl, blocks=4)
  lowering = mtf.Lowering(graph, {mesh: impl})
  path = mtf.save_checkpoint(str(tmp_path) + "/", lowering)
  values = [lowering.export_to_tf_tensor(t).numpy() for t in [loss] + grads]
  reference = {"loss": values[0], "grads": _by_plain_name(variables, values[1:])}
  with pytest.warns(UserWarning, match="not pipelined"):
    got = _pipelined(mtf.PlacementMeshImpl("", "", [""]), path, blocks=4,
                     recompute_grads=True)
  assert "decoder/pipeline/repeat_1/layer_001/DenseReluDense/wo/kernel" in [
      v.name for v in got["variables"]]
  _check_same_numbers(got, reference)


def test_checkpoint_holds_plain_names_and_shapes_both_ways(on_stage2, plain, tmp_path):
  """The pipelined model writes the plain model's keys, shapes and values (it was
  restored from the plain checkpoint); and the plain keys restore into it."""
  path = mtf.save_checkpoint(str(tmp_path) + "/", on_stage2["lowering"])
  written = tf.train.load_checkpoint(path)
  original = tf.train.load_checkpoint(plain["checkpoint"])
  assert written.get_variable_to_shape_map() == original.get_variable_to_shape_map()
  for name in original.get_variable_to_shape_map():
    np.testing.assert_array_equal(written.get_tensor(name), original.get_tensor(name))
  assert not [n for n in written.get_variable_to_shape_map() if "pipeline" in n]


def test_trainer_trains_pipelined_lm_and_plain_model_evaluates_it(tmp_path, capsys):
  """utils.run trains the pipelined LM (Adafactor, stacked_dim_names) for 2 steps; its
  checkpoint has the plain names (slots too), and eval of it by the plain LM gives the
  pipelined LM's eval loss."""
  corpus = trainer_helpers.write_corpus(tmp_path)
  sizes = ("num_layers", "d_model", "d_ff", "num_heads", "d_kv",
           "Unitransformer.max_length", "utils.run.sequence_length")
  params = [p for p in trainer_helpers.tiny_lm_bindings(
      tmp_path / "model", corpus, train_steps=2, save_every=2) if not p.startswith(sizes)]
  params += ["num_layers = 2", "d_model = 8", "d_ff = 16", "num_heads = 2", "d_kv = 4",
             "Unitransformer.max_length = 8", "utils.run.sequence_length = 8",
             "utils.run.perplexity_eval_steps = 1"]
  pipelined = ["make_layer_stack.layer_stack_cls = @transformer.PipelinedLayerStack",
               "PipelinedLayerStack.num_stages = 2",
               "PipelinedLayerStack.num_microbatches = 2",
               "mesh_tf.optimize.AdafactorOptimizer.stacked_dim_names = ['stages']"]
  with contextlib.redirect_stdout(io.StringIO()), pytest.warns(UserWarning,
                                                                match="not pipelined"):
    history = trainer_helpers.run_with(params + pipelined)
  assert [s for s, _ in history] == [2] and np.isfinite(history[0][1])
  keys = tf.train.load_checkpoint(str(tmp_path / "model")).get_variable_to_shape_map()
  assert keys["transformer/block_001/layer_001/DenseReluDense/wi/kernel"] == [8, 16]
  assert keys["transformer/block_001/layer_000/SelfAttention/q_slot_v"] == [8, 8]
  assert not [k for k in keys if "pipeline" in k or "stages" in k]
  evaluate = ["utils.run.dataset_split = 'validation'"]
  with pytest.warns(UserWarning, match="not pipelined"):
    pipelined_eval = trainer_helpers.run_with(params + pipelined + evaluate, mode="eval",
                                              eval_checkpoint_step=2)
  plain_eval = trainer_helpers.run_with(params + evaluate, mode="eval",
                                        eval_checkpoint_step=2)
  capsys.readouterr()
  assert pipelined_eval["batches"] == plain_eval["batches"] == 1
  assert pipelined_eval["loss"] == pytest.approx(plain_eval["loss"], abs=1e-5)


class _Model:
  model_dim = mtf.Dimension("d_model", D_MODEL)
  ensemble_dims = []
  fully_autoregressive = True
  autoregressive = True

  def __init__(self, layout=None):
    self.mesh_layout = layout


def _context(batch=BATCH, mode=ModeKeys.TRAIN, layout=None):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  dims = [mtf.Dimension("batch", batch), mtf.Dimension("length", LENGTH),
          _Model.model_dim]
  x = mtf.zeros(mesh, mtf.Shape(dims))
  context = Context(_Model(layout), mesh, dims[:1], dims[1], mtf.VariableDType(),
                    mode=mode, losses=[])
  return context, x


def _stack(blocks=2, **kwargs):
  return transformer.make_layer_stack(
      layers=_layers(), num_layers=blocks,
      layer_stack_cls=lambda layers: PipelinedLayerStack(layers, **kwargs))


def test_bad_configurations_fail_in_one_line_naming_the_numbers():
  with pytest.raises(mtf.MtfError, match=r"6 layers \(3 blocks of 2\) do not divide "
                                         r"into 2 stages") as e1:
    _stack(blocks=3, num_stages=2)
  with pytest.raises(mtf.ShapeError, match="batch dim batch:6 does not divide into 4 "
                                           "microbatches") as e2:
    _stack(num_stages=2, num_microbatches=4).call(*_context(batch=6))
  layout = mtf.MeshLayout("stage:4", "stages:stage")
  with pytest.raises(mtf.LayoutError, match="num_stages=2 but the layout splits 'stages' "
                                            "over mesh dim 'stage' of size 4") as e3:
    _stack(num_stages=2).call(*_context(layout=layout))
  with pytest.warns(UserWarning, match="no layout rule splits 'stages'.*not pipelined"):
    _stack(num_stages=2).call(*_context(layout=mtf.MeshLayout("batch:2", "batch:batch")))
  with pytest.raises(mtf.MtfError, match="does not decode from cached states") as e4:
    _stack(num_stages=2).call(*_context(mode="incremental"))
  unnamed = _layers()
  with pytest.raises(mtf.MtfError, match="every layer needs its own name") as e5:
    PipelinedLayerStack(unnamed, num_stages=2)
  for e in (e1, e2, e3, e4, e5):  # one line (and the lines gin adds on its way out)
    lines = str(e.value).splitlines()
    assert lines[0].startswith("PipelinedLayerStack") and all(
        line.strip().startswith("In call to configurable") for line in lines[1:]), lines


def test_interface_and_sublayer_defaults_follow_layer_stack():
  stack = _stack(blocks=4, num_stages=2)
  plain = transformer.make_layer_stack(layers=_layers(), num_layers=4)
  assert stack.num_layers == plain.num_layers == 8
  assert [l.name for l in stack.layers] == [l.name for l in plain.layers]
  assert stack._sublayers_per_layer == plain._sublayers_per_layer  # pylint: disable=protected-access
  assert (stack.layers_per_block, stack.num_repeats, stack.num_microbatches) == (2, 2, 2)
  gin.parse_config("LayerStack.sublayers_final = [@transformer.sublayer_rms_norm]")
  assert _stack(num_stages=2)._sublayers_final == [ls.sublayer_rms_norm]  # pylint: disable=protected-access


def test_dropout_in_stages_is_supported(plain):
  """Dropout inside the stages (masks carry the stages dim) changes the loss, and the
  loss and gradients stay finite."""
  gin.parse_config(["transformer.sublayer_dropout.dropout_rate = 0.5",
                    "transformer_layers.SelfAttention.dropout_rate = 0.5"])
  with pytest.warns(UserWarning, match="not pipelined"):
    got = _pipelined(mtf.PlacementMeshImpl("", "", [""]), plain["checkpoint"])
  assert np.isfinite(got["loss"]) and abs(got["loss"] - plain["loss"]) > 1e-3
  assert all(np.all(np.isfinite(g)) for g in got["grads"].values())
