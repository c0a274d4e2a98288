"""bfloat16 activations over float32 masters, on placement, SIMD emulation and GSPMD.

A toy LM takes a few SGD steps on a 2x4 mesh (data and model parallel) with
VariableDType(master=float32, slice=float32 or bfloat16, activation=bfloat16): every
einsum of the lowered step is bfloat16, the variables stay float32 (masters, and the
slices unless asked otherwise), and the losses follow float32's. The trainer trains with
gin_configs/bf16.gin and checkpoints float32 values.
"""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import trainer_helpers
from models import train_steps
from models.transformer import model_graph, transformer, transformer_layers
from models.transformer.trainer import gin_setup
from models.transformer import utils
from models.transformer.context import ModeKeys

MESH, LAYOUT = "b:2;m:4", "batch:b;heads:m;d_ff:m;vocab:m"
BATCH, LENGTH, VOCAB, STEPS = 8, 16, 32, 4
F32 = mtf.VariableDType(tf.float32, tf.float32, tf.float32)
BF16 = mtf.VariableDType(tf.float32, tf.float32, tf.bfloat16)
BF16_SLICES = mtf.VariableDType(tf.float32, tf.bfloat16, tf.bfloat16)


def _graph(variable_dtype):
  layers = []
  for b in range(2):
    attention = transformer_layers.SelfAttention(num_heads=4, key_value_size=4)
    ffn = transformer_layers.DenseReluDense(hidden_size=32)
    attention.set_name("block_%03d/layer_000" % b)
    ffn.set_name("block_%03d/layer_001" % b)
    layers += [attention, ffn]
  model = transformer.Unitransformer(
      layer_stack=transformer.LayerStack(layers), d_model=16, input_vocab_size=VOCAB,
      output_vocab_size=VOCAB, autoregressive=True, max_length=LENGTH)
  return model_graph.ModelGraph(model, BATCH, LENGTH, ["targets"], ModeKeys.TRAIN,
                                variable_dtype, optimizer=mtf.optimize.SgdOptimizer(0.5))


def _train(backend, variable_dtype):
  """(losses, {einsum output: lowered dtypes} of the einsums not float32 by design,
  slice dtypes, master dtypes)."""
  graph = _graph(variable_dtype)
  impl = mtf.make_mesh_impl(backend, MESH, LAYOUT, ["/cpu:%d" % i for i in range(8)])
  tf.random.set_seed(0)
  graph.lowering(impl)
  einsums = [op.outputs[0] for op in graph.graph.operations
             if isinstance(op, mtf.EinsumOperation)]
  # attention logits (q.k, and its two gradients) stay float32 by design, as in the
  # original (attention(float32_logits=True)); every other einsum is an activation
  float32_by_design = {y.name for y in einsums if y.dtype == tf.float32}
  if variable_dtype.activation_dtype == tf.bfloat16:
    assert len(float32_by_design) == 3 * 2, float32_by_design  # 2 attention layers
  lowered = {}

  @tf.function(jit_compile=impl.needs_xla)
  def step(t):
    lowering = graph.lowering(impl, {"targets": t})
    loss = train_steps.lower_train_step(lowering, graph.loss, graph.update_ops)
    for y in einsums:  # recorded while tracing: the dtypes the step computes in
      lowered[y.name] = {s.dtype for s in lowering.tensors[y].all_slices}
    return loss
  targets = tf.constant(np.random.RandomState(1).randint(
      1, VOCAB, size=(BATCH, LENGTH)).astype(np.int32))
  losses = [float(step(targets)) for _ in range(STEPS)]
  lowered = {k: v for k, v in lowered.items() if k not in float32_by_design}
  variables = graph.graph.trainable_variables
  slice_dtypes = {v.dtype for s in impl.variable_store.values()
                  for v in getattr(s, "slice_variables", [getattr(s, "variable", None)])
                  if v is not None}
  master_dtypes = {v.get_master().dtype for v in variables}
  return losses, lowered, slice_dtypes, master_dtypes


@pytest.fixture(scope="module")
def float32_losses():
  return _train("placement", F32)[0]


@pytest.mark.parametrize("backend", ["placement", "simd", "gspmd"])
def test_bf16_activations_with_float32_variables(backend, float32_losses):
  losses, lowered, slice_dtypes, master_dtypes = _train(backend, BF16)
  assert len(lowered) > 30
  assert all(d == {tf.bfloat16} for d in lowered.values()), lowered
  assert slice_dtypes == {tf.float32} and master_dtypes == {tf.float32}
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
  np.testing.assert_allclose(losses, float32_losses, rtol=0.02)


def test_bf16_slices_keep_float32_masters(float32_losses):
  losses, lowered, slice_dtypes, master_dtypes = _train("placement", BF16_SLICES)
  assert all(d == {tf.bfloat16} for d in lowered.values()), lowered
  assert slice_dtypes == {tf.bfloat16} and master_dtypes == {tf.float32}
  np.testing.assert_allclose(losses, float32_losses, rtol=0.02)


def test_trainer_trains_with_bf16_gin_and_checkpoints_float32(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  params = trainer_helpers.tiny_lm_bindings(tmp_path / "model", corpus, train_steps=2,
                                            save_every=2, log_every=1)
  params += ["utils.run.mesh_shape = 'b:2;m:4'",
             "utils.run.layout_rules = 'batch:b;heads:m;d_ff:m;vocab:m'"]
  gin.clear_config()
  try:
    gin_setup.parse_gin(["bf16.gin"], params)
    assert utils.get_variable_dtype().activation_dtype == tf.bfloat16
    history = utils.run()
  finally:
    gin.clear_config()
  assert [s for s, _ in history] == [1, 2]
  assert all(np.isfinite(loss) for _, loss in history)
  reader = tf.train.load_checkpoint(str(tmp_path / "model"))
  dtypes = reader.get_variable_to_dtype_map()
  weights = [k for k in dtypes if k.startswith("transformer/")]
  assert "transformer/embedding" in weights, sorted(dtypes)
  assert all(dtypes[k] == tf.float32 for k in weights), dtypes
