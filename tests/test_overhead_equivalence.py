"""The plain-TF LM of benchmarks.overhead (benchmarks/tf_transformer.py) computes what
models.transformer's Unitransformer computes -- logits, loss, gradients and optimizer
steps -- so the benchmark times the same work on both sides; it also reproduces the
original library's checkpoint fixture."""
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from benchmarks import common
from benchmarks import overhead
from benchmarks import tf_transformer

FIXTURE = (pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
           / "orig_mtf_lm")
HEADS = common.TRANSFORMER_SIZES["tiny"]["num_heads"]


def _mtf_logits_loss_grads(mesh_impl, targets):
  graph = overhead.build_mtf_lm("tiny", mtf.optimize.SgdOptimizer(0.01))
  variables = graph.graph.trainable_variables
  grads = mtf.gradients([graph.loss], [v.outputs[0] for v in variables])
  lowering = graph.lowering(mesh_impl, {"targets": tf.constant(targets)})
  export = lambda t: lowering.export_to_tf_tensor(t).numpy()
  return (overhead.trainable_values(graph, lowering), export(graph.logits),
          float(export(graph.loss)),
          {v.name: export(g) for v, g in zip(variables, grads)}, graph.model.z_loss)


@pytest.mark.parametrize("mesh_impl", [
    lambda: mtf.PlacementMeshImpl("", "", [""]),
    lambda: mtf.SimdMeshImpl("b:2;m:2", "batch:b;heads:m;d_ff:m;vocab:m"),
], ids=["placement-single", "simd-2x2-dp+mp"])
def test_logits_loss_and_every_gradient_match_mtf(mesh_impl):
  targets = overhead.synthetic_targets("tiny")
  assert (targets == 0).any() and (targets > 0).any()  # padding carries no loss
  weights, logits, loss, grads, z_loss = _mtf_logits_loss_grads(mesh_impl(), targets)
  plain = tf_transformer.TfTransformerLm(weights, HEADS, z_loss=z_loss)
  assert sorted(plain.variables) == sorted(grads) and plain.num_blocks == 1
  with tf.GradientTape() as tape:
    ref_logits, ref_loss = plain.logits_and_loss(targets, train=True)
  names = sorted(plain.variables)
  ref_grads = tape.gradient(ref_loss, [plain.variables[n] for n in names])
  assert logits.shape == (4, 8, 128)  # vocab 20 padded to 128
  np.testing.assert_allclose(logits, ref_logits.numpy(), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(loss, float(ref_loss), rtol=1e-6)
  # The z-loss term is part of the training loss on both sides.
  _, eval_loss = plain.logits_and_loss(targets, train=False)
  assert loss - float(eval_loss) > 100 * 1e-6 * loss
  for name, ref in zip(names, ref_grads):
    np.testing.assert_allclose(grads[name], tf.convert_to_tensor(ref).numpy(), atol=1e-6,
                               rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("optimizer", ["adafactor", "sgd"])
def test_train_steps_match_mtf(optimizer):
  # Factoring from 8 up: the [128, 16] embedding and the FFN kernels get row/column
  # slots, the attention weights and norms a full one.
  pair = overhead.StepPair("tiny", optimizer, min_dim_size_to_factor=8)
  targets = tf.constant(overhead.synthetic_targets("tiny"))
  losses = [(float(pair.mtf_step(targets)), float(pair.tf_step(targets)))
            for _ in range(3)]
  for mtf_loss, tf_loss in losses:
    np.testing.assert_allclose(mtf_loss, tf_loss, rtol=1e-5)
  assert losses[2][0] < losses[0][0]
  lowering = pair.graph.lowering(pair.mesh_impl)
  mtf_values = {v.name: lowering.export_to_tf_tensor(v.outputs[0]).numpy()
                for v in pair.graph.graph.all_variables}
  tf_values = {n: v.numpy() for n, v in pair.plain.variables.items()}
  tf_values.update({n: v.numpy() for n, v in pair.updater.slots.items()})
  assert sorted(mtf_values) == sorted(tf_values)
  if optimizer == "adafactor":
    assert "transformer/embedding_slot_vr" in tf_values
    assert "transformer/rms_norm/scale_slot_v" in tf_values
  for name, value in mtf_values.items():
    np.testing.assert_allclose(value, tf_values[name].reshape(value.shape), rtol=1e-4,
                               atol=1e-6, err_msg=name)


def test_factored_axes_pick_the_two_largest_dims():
  assert tf_transformer.factored_axes([384, 64], 64) == (0, 1)
  assert tf_transformer.factored_axes([64, 256], 64) == (1, 0)
  assert tf_transformer.factored_axes([64, 64], 64) == (0, 1)  # ties: earlier axis
  assert tf_transformer.factored_axes([384, 64], 128) is None
  assert tf_transformer.factored_axes([384], 1) is None


@pytest.mark.skipif(not (FIXTURE / "variables.txt").exists(),
                    reason="fixture %s is not present" % FIXTURE)
def test_reproduces_the_original_library_fixture():
  plain = tf_transformer.TfTransformerLm.from_checkpoint(str(FIXTURE / "model.ckpt-20"),
                                                         num_heads=4)
  assert plain.num_blocks == 2 and "transformer/embedding" in plain.variables
  logits, loss = plain.logits_and_loss(np.load(FIXTURE / "inputs.npy"), train=False)
  np.testing.assert_allclose(logits.numpy(), np.load(FIXTURE / "logits.npy"), atol=1e-4,
                             rtol=0)
  np.testing.assert_allclose(float(loss), float((FIXTURE / "loss.txt").read_text()),
                             rtol=1e-5)


def _tiny_weights():
  weights, _, _, _, _ = _mtf_logits_loss_grads(mtf.PlacementMeshImpl("", "", [""]),
                                               overhead.synthetic_targets("tiny"))
  return weights


def test_missing_weight_is_named():
  weights = _tiny_weights()
  del weights["transformer/block_000/layer_001/DenseReluDense/wo/kernel"]
  with pytest.raises(mtf.MtfError, match="DenseReluDense/wo/kernel"):
    tf_transformer.TfTransformerLm(weights, HEADS)


def test_heads_not_dividing_q_is_a_shape_error():
  with pytest.raises(mtf.ShapeError, match=r"SelfAttention/q has 16 columns.*num_heads=3"):
    tf_transformer.TfTransformerLm(_tiny_weights(), 3)


def test_bad_checkpoints_name_the_file(tmp_path):
  missing = str(tmp_path / "nothing" / "model.ckpt-1")
  with pytest.raises(mtf.CheckpointError, match="nothing/model.ckpt-1"):
    tf_transformer.TfTransformerLm.from_checkpoint(missing, HEADS)
  other = tf.train.Checkpoint(w=tf.Variable([1.0]))
  path = other.write(str(tmp_path / "other" / "ckpt"))
  with pytest.raises(mtf.CheckpointError, match="other/ckpt.*no variables under "
                                                "'transformer/'"):
    tf_transformer.TfTransformerLm.from_checkpoint(path, HEADS)
