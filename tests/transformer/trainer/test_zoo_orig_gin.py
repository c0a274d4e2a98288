"""The original's gin files that bind zoo layers load through gin_compat unchanged:
defaults.gin (TalkingHeadsSelfAttention, GeneralBilinearSelfAttention) and
transparent_attention.gin, whose Bitransformer (at toy size) trains a step with the
same loss and gradients on one device and on a 2x2 data+model-parallel mesh."""
import pathlib

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.trainer import gin_compat
from models.transformer.trainer import gin_setup
from models.transformer import transformer
from models.transformer import transformer_layers as tl
from models.transformer.context import ModeKeys

ORIG_GIN = (pathlib.Path(__file__).resolve().parents[3].parent / "shared" / "fixtures"
            / "orig_gin")

pytestmark = pytest.mark.skipif(not ORIG_GIN.exists(),
                                reason="fixture %s is not present" % ORIG_GIN)

TOY = """
d_model = 8
d_ff = 16
num_heads = 2
d_kv = 4
dropout_rate = 0.0
Unitransformer.max_length = 8
"""


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  gin_setup.import_configurables()
  yield
  gin.clear_config()


def _parse(*names):
  skipped = []
  for name in names:
    path = ORIG_GIN / name
    skipped += gin_compat.parse_original_config(path.read_text(), str(path))
  return skipped


def test_defaults_gin_binds_the_zoo_attention_layers():
  skipped = _parse("defaults.gin")
  assert not [s for s in skipped if "Attention" in s.binding], skipped
  assert tl.TalkingHeadsSelfAttention().dropout_rate == 0.1
  assert tl.GeneralBilinearSelfAttention().dropout_rate == 0.1


def _loss_and_w_grad(model, mesh_shape, layout):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  rng = np.random.RandomState(0)
  shape = [mtf.Dimension("batch", 2), mtf.Dimension("length", 8)]
  inputs = mtf.import_tf_tensor(mesh, rng.randint(2, 16, size=[2, 8]).astype(np.int32),
                                shape)
  targets = mtf.import_tf_tensor(mesh, rng.randint(2, 16, size=[2, 8]).astype(np.int32),
                                 shape)
  _, loss = model.call_simple(inputs, targets, compute_loss=True, mode=ModeKeys.TRAIN,
                              variable_dtype=mtf.VariableDType(tf.float32))
  w = graph.variable_by_name(
      "decoder/block_000/layer_001/TransparentEncDecAttention/w").outputs[0]
  q = graph.variable_by_name(
      "decoder/block_005/layer_001/TransparentEncDecAttention/q").outputs[0]
  grads = mtf.gradients([loss], [w, q])
  n = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.PlacementMeshImpl(mesh_shape, layout, ["/cpu:%d" % i for i in range(n)])
  tf.random.set_seed(1)
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [lowering.export_to_tf_tensor(t).numpy() for t in [loss] + grads], graph


def test_transparent_attention_gin_trains_a_toy_bitransformer():
  skipped = _parse("defaults.gin", "transparent_attention.gin")
  assert not [s for s in skipped if "Attention" in s.binding], skipped
  gin.parse_config(TOY)
  model = transformer.make_bitransformer(input_vocab_size=16, output_vocab_size=16)
  layers = model.decoder.layer_stack.layers
  assert [type(l).__name__ for l in layers[:3]] == [
      "SelfAttention", "TransparentEncDecAttention", "DenseReluDense"]
  assert (layers[1].layers_per_encoder_module, layers[1].decoder_num_modules) == (2, 6)
  (loss, w_grad, q_grad), graph = _loss_and_w_grad(model, "", "")
  # One mixing matrix: encoder modules (6 + 1) by decoder modules (6).
  mixes = [v for v in graph.trainable_variables if v.name.endswith("/w")]
  assert [v.shape.to_integer_list for v in mixes] == [[7, 6]]
  assert np.isfinite(loss) and np.abs(w_grad).max() > 0 and np.abs(q_grad).max() > 0
  (loss2, w_grad2, q_grad2), _ = _loss_and_w_grad(
      model, "batch:2;model:2", "batch:batch;heads:model;d_ff:model;vocab:model")
  np.testing.assert_allclose(loss2, loss, rtol=1e-5)
  np.testing.assert_allclose(w_grad2, w_grad, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(q_grad2, q_grad, rtol=1e-4, atol=1e-6)
