"""The original library's tiny LM checkpoint restores by name and reproduces its logits
and loss, on one device and on a 2x4 data+model-parallel mesh."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer.context import ModeKeys
import orig_fixture
from orig_fixture import FIXTURE

# The original trainer's precisions: bfloat16 masters (in the checkpoint), float32 slices.
VDTYPE = mtf.VariableDType(tf.bfloat16, tf.float32, tf.float32)

pytestmark = pytest.mark.skipif(not (FIXTURE / "variables.txt").exists(),
                                reason="fixture %s is not present" % FIXTURE)


def fixture_model():
  """The fixture's Unitransformer, written in Python (see its README)."""
  layers = []
  for block in range(2):
    attention = transformer_layers.SelfAttention(num_heads=4, key_value_size=16)
    ffn = transformer_layers.DenseReluDense(hidden_size=64)
    attention.set_name("block_%03d/layer_000" % block)
    ffn.set_name("block_%03d/layer_001" % block)
    layers += [attention, ffn]
  stack = transformer.LayerStack(
      layers, sublayers_initial=[transformer.sublayer_dropout],
      sublayers_per_layer=[transformer.sublayer_rms_norm, transformer.sublayer_call_layer,
                           transformer.sublayer_dropout, transformer.sublayer_residual],
      sublayers_final=[transformer.sublayer_rms_norm, transformer.sublayer_dropout])
  return transformer.Unitransformer(
      layer_stack=stack, d_model=32, input_vocab_size=64, output_vocab_size=64,
      autoregressive=True, max_length=16, shared_embedding_and_softmax_weights=True)


def _checkpoint_model_variables():
  names = []
  for line in (FIXTURE / "variables.txt").read_text().splitlines():
    name = line.split("\t")[0]
    if name != "global_step" and "_slot_" not in name:
      names.append(name)
  return sorted(names)


def run_fixture_model(mesh_shape, layout, devices, mode):
  """Restores the checkpoint into the model on a mesh; returns (logits, loss, names)."""
  logits, loss, result, impl = orig_fixture.run_restored(
      fixture_model(), mesh_shape, layout, devices, mode, VDTYPE)
  assert result.global_step == 20
  return logits, loss, sorted(result.names), sorted(impl.variable_store)


@orig_fixture.MESH_CASES
def test_fixture_logits_and_loss_reproduced(mesh_shape, layout, devices):
  logits, loss, restored, model_vars = run_fixture_model(mesh_shape, layout, devices,
                                                         ModeKeys.EVAL)
  # Every model variable came from the checkpoint, and the model has exactly the
  # checkpoint's model variables (optimizer slots and global_step aside).
  assert model_vars == restored == _checkpoint_model_variables()
  orig_fixture.check_against_original(logits, loss)


def test_fixture_train_mode_adds_z_loss():
  logits, eval_loss, _, _ = run_fixture_model("", "", [""], ModeKeys.EVAL)
  _, train_loss, _, _ = run_fixture_model("", "", [""], ModeKeys.TRAIN)
  # dropout_rate is 0, so training differs only by z_loss * mean(logsumexp^2).
  m = logits.astype(np.float64).max(-1, keepdims=True)
  lse = (m[..., 0] + np.log(np.exp(logits - m).sum(-1)))
  expected_gap = 1e-4 * np.mean(lse ** 2)
  assert expected_gap > 1e-5
  np.testing.assert_allclose(train_loss - eval_loss, expected_gap, rtol=1e-3)
