"""LayerStack(recompute_grads=True) saves measured memory, and changes no number.

An 8-layer LM (toy widths, long enough sequences that activations dominate) takes two SGD
steps with and without rematerialization on placement, SIMD emulation and GSPMD (under
tf.function; GSPMD under XLA). The allocator's peak of the second step, less what was
resident before it and less the weights' bytes (a bound on the gradients), is the
activation part; with recompute_grads it must be at most a third. Peaks are measured
in one subprocess, since TF_CPU_ALLOCATOR_USE_BFC must be set before TensorFlow starts.
Losses and weights must equal those of the run without rematerialization (1e-6).

Run as a script, this file is that subprocess (it prints one JSON line).
"""
import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
# backend -> (mesh shape, layout rules); placement on one device, the others data-parallel.
BACKENDS = {"placement": ("", ""), "simd": ("b:2", "batch:b"), "gspmd": ("b:2", "batch:b")}
SIZES = dict(num_blocks=8, batch=8, length=64, d_model=32, heads=4, d_kv=8, d_ff=128,
             vocab=64)


def build_lm(recompute_grads, num_blocks, batch, length, d_model, heads, d_kv, d_ff,
             vocab):
  """A ModelGraph training step (SGD) of an LM of num_blocks attention + ReLU blocks."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from models.transformer import model_graph, transformer, transformer_layers
  from models.transformer.context import ModeKeys  # pylint: disable=g-import-not-at-top
  layers = []
  for b in range(num_blocks):
    attention = transformer_layers.SelfAttention(num_heads=heads, key_value_size=d_kv)
    ffn = transformer_layers.DenseReluDense(hidden_size=d_ff)
    attention.set_name("block_%03d/layer_000" % b)
    ffn.set_name("block_%03d/layer_001" % b)
    layers += [attention, ffn]
  model = transformer.Unitransformer(
      layer_stack=transformer.LayerStack(layers, recompute_grads=recompute_grads),
      d_model=d_model, input_vocab_size=vocab, output_vocab_size=vocab,
      autoregressive=True, max_length=length)
  return model_graph.ModelGraph(model, batch, length, ["targets"], ModeKeys.TRAIN,
                                mtf.VariableDType(tf.float32),
                                optimizer=mtf.optimize.SgdOptimizer(0.1))


def _measure(backend, recompute_grads, targets):
  """(activation bytes, [loss 1, loss 2], final weights) of two steps on backend."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from models import train_steps  # pylint: disable=g-import-not-at-top
  mesh_shape, layout = BACKENDS[backend]
  graph = build_lm(recompute_grads, **SIZES)
  n = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.make_mesh_impl(backend, mesh_shape, layout,
                            ["/cpu:%d" % i for i in range(n)] if n > 1 else [""])

  def in_use():
    return tf.config.experimental.get_memory_info("CPU:0")["current"]
  before_variables = in_use()
  tf.random.set_seed(0)  # the same initial weights for every run
  graph.lowering(impl)
  weight_bytes = in_use() - before_variables

  @tf.function(jit_compile=impl.needs_xla)
  def step(t):
    return train_steps.lower_train_step(graph.lowering(impl, {"targets": t}), graph.loss,
                                        graph.update_ops)
  losses = [float(step(targets))]
  tf.config.experimental.reset_memory_stats("CPU:0")
  resident = in_use()
  losses.append(float(step(targets)))
  peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  weights = [v.get_master().numpy() for v in graph.graph.trainable_variables]
  return peak - resident - weight_bytes, losses, weights


def worker():
  """Measures every backend with and without recompute_grads; prints one JSON line."""
  from mesh_tf import utils  # pylint: disable=g-import-not-at-top
  utils.configure_virtual_cpus(8)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  targets = tf.constant(np.random.RandomState(0).randint(
      1, SIZES["vocab"], size=(SIZES["batch"], SIZES["length"])).astype(np.int32))
  result = {}
  for backend in BACKENDS:
    plain_act, plain_losses, plain_w = _measure(backend, False, targets)
    remat_act, remat_losses, remat_w = _measure(backend, True, targets)
    result[backend] = dict(
        plain_activation_bytes=plain_act, remat_activation_bytes=remat_act,
        plain_losses=plain_losses, remat_losses=remat_losses,
        max_weight_difference=max(float(np.max(np.abs(a - b)))
                                  for a, b in zip(plain_w, remat_w)))
  print(json.dumps(result))


@pytest.fixture(scope="module")
def measured():
  env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run([sys.executable, os.path.abspath(__file__)], cwd=REPO_ROOT,
                       env=env, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_remat_keeps_at_most_a_third_of_the_activation_memory(measured, backend):
  m = measured[backend]
  # the measurement sees the activations at all (several MB at these sizes)
  assert m["plain_activation_bytes"] > 4 * 2 ** 20, m
  assert m["remat_activation_bytes"] * 3 <= m["plain_activation_bytes"], m


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_remat_changes_no_loss_and_no_weight(measured, backend):
  m = measured[backend]
  assert m["remat_losses"] == pytest.approx(m["plain_losses"], rel=1e-6, abs=1e-6), m
  assert m["max_weight_difference"] <= 1e-6, m
  assert m["plain_losses"][1] < m["plain_losses"][0]  # the steps did train


if __name__ == "__main__":
  sys.path.insert(0, REPO_ROOT)
  worker()
