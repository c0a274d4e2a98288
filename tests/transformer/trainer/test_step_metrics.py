"""step_metrics: the FLOPs counted in traced train steps against analytic counts, and
the trainer's MFU, memory, cost-model split and opt-in profile."""
import glob
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import trainer_helpers
from trainer_helpers import run_with
from models.transformer.trainer import step_metrics
from models.transformer.trainer import summaries

DP_MP_2X4 = ["utils.run.mesh_shape = 'b:2;m:4'",
             "utils.run.layout_rules = 'batch:b;d_ff:m;heads:m;vocab:m'"]


def lm_train_flops(tokens, layers, d_model, d_ff, heads, d_kv, vocab, length):
  """FLOPs of one train step of a decoder-only Transformer LM: 6 x tokens x the
  multiply-adds per token of its matmuls (forward 2, backward 4): per layer the q, k,
  v, o projections, the two d_ff projections and attention's q.k and p.v over `length`
  positions; then the logits (the embedding lookup is a gather: no matmul)."""
  per_token = layers * (4 * d_model * heads * d_kv + 2 * d_model * d_ff
                        + 2 * length * heads * d_kv) + d_model * vocab
  return 6 * tokens * per_token


# trainer_helpers.tiny_lm_bindings: 1 layer, d_model 16, d_ff 32, 4 heads of 4, batch
# 8 x length 16; the byte vocabulary (259 ids) padded to a multiple of 128.
TINY_LM_FLOPS = lm_train_flops(tokens=8 * 16, layers=1, d_model=16, d_ff=32, heads=4,
                               d_kv=4, vocab=384, length=16)


def test_dense_layer_train_step_counts_forward_and_both_gradients():
  m, k, n = 32, 48, 40
  x = tf.Variable(tf.random.normal([m, k]))
  w = tf.Variable(tf.random.normal([k, n]))

  def make_step(variables):
    @tf.function
    def step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
      for v, g in zip(variables, tape.gradient(loss, variables)):
        v.assign_sub(0.01 * g)
      return loss
    return step

  flops, unknown = step_metrics.graph_flops(
      make_step([x, w]).get_concrete_function().graph)
  assert unknown == 0
  assert flops == 3 * 2 * m * n * k  # y = xw, dx = dy w^T, dw = x^T dy
  flops, _ = step_metrics.graph_flops(make_step([w]).get_concrete_function().graph)
  assert flops == 2 * 2 * m * n * k  # dx is not needed: not made, or pruned


def test_einsum_batch_matmul_conv_and_function_calls():
  inner = tf.function(lambda a, b: tf.einsum("...ij,jk->...ik", a, b))

  @tf.function
  def f(a, b, c, image, kernel):
    unused = tf.matmul(a[0], b)  # not an output: pruned, not counted
    del unused
    return (inner(a, b), inner(a, b), tf.einsum("bij,jk->bik", a, b),
            tf.linalg.matmul(a, c), tf.nn.conv2d(image, kernel, 1, "SAME"))

  graph = f.get_concrete_function(
      tf.TensorSpec([2, 3, 4]), tf.TensorSpec([4, 5]), tf.TensorSpec([2, 4, 5]),
      tf.TensorSpec([1, 8, 8, 3]), tf.TensorSpec([3, 3, 3, 4])).graph
  batch_matmul = 2 * 2 * 3 * 4 * 5
  conv = 2 * (8 * 8 * 4) * (3 * 3 * 3)
  assert step_metrics.graph_flops(graph) == (4 * batch_matmul + conv, 0)


@pytest.mark.parametrize("depthwise", [False, True], ids=["conv2d", "depthwise"])
def test_convolution_train_step_counts_forward_and_both_gradients(depthwise):
  image = tf.Variable(tf.random.normal([2, 8, 8, 3]))
  kernel = tf.Variable(tf.random.normal([3, 3, 3, 2 if depthwise else 4]))

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      if depthwise:
        y = tf.nn.depthwise_conv2d(image, kernel, [1, 1, 1, 1], "SAME")
      else:
        y = tf.nn.conv2d(image, kernel, 1, "SAME")
      loss = tf.reduce_sum(y ** 2)
    for v, g in zip([image, kernel], tape.gradient(loss, [image, kernel])):
      v.assign_sub(0.01 * g)
    return loss

  outputs = 2 * 8 * 8 * (3 * 2 if depthwise else 4)
  taps = 3 * 3 * (1 if depthwise else 3)  # what each output element sums
  assert step_metrics.graph_flops(step.get_concrete_function().graph) == (
      3 * 2 * outputs * taps, 0)


def test_conditionals_count_their_dearest_branch_and_loops_their_body_once():
  big, small = tf.TensorSpec([8, 16]), tf.TensorSpec([16, 4])

  @tf.function
  def f(flag, index, a, b):
    cond = tf.cond(flag, lambda: tf.matmul(a, b), lambda: tf.zeros([8, 4]))
    case = tf.switch_case(index, [lambda: tf.matmul(a, b), lambda: a[:, :4] * 2.0,
                                  lambda: tf.matmul(a, b) + tf.matmul(a, b)])
    loop = tf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x + tf.matmul(a, b)),
                         (tf.constant(0), tf.zeros([8, 4])))[1]
    return cond, case, loop

  graph = f.get_concrete_function(tf.TensorSpec([], tf.bool),
                                  tf.TensorSpec([], tf.int32), big, small).graph
  matmul = 2 * 8 * 4 * 16
  assert step_metrics.graph_flops(graph) == (matmul + 2 * matmul + matmul, 0)


def _last_line(out, step, total):
  lines = [l for l in out.splitlines() if l.startswith("step %d/%d [" % (step, total))]
  assert len(lines) == 1, out[-3000:]
  return lines[0]


PROGRESS = re.compile(
    r"^step 4/4 \[#{20}\] loss \d+\.\d{4} lr \S+ \d+ tokens/s \| MFU \d+\.\d% \| "
    r"(max RSS \d+ MB|peak mem \d+ MB( \(CPU, all devices\)|/dev)) \| ETA 0:00:00$")


def test_single_device_run_reports_mfu_memory_split_and_writes_a_profile(tmp_path,
                                                                         capsys):
  model_dir = tmp_path / "model"
  corpus = trainer_helpers.write_corpus(tmp_path)
  run_with(trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=4,
                                            save_every=4, peak_flops=None)
           + ["step_metrics.profile_steps = (2, 3)"])
  out = capsys.readouterr().out
  assert PROGRESS.match(_last_line(out, 4, 4)), out[-3000:]
  assert re.search(r"^peak \S+ FLOP/s \(the host's float32 2048x2048 matmul rate\)$",
                   out, re.M)
  assert re.search(r"^predicted step: compute 100% / communication 0% \(cost model",
                   out, re.M)  # one device: nothing to communicate
  assert "profiling steps 2-3 into %s" % model_dir in out
  traces = glob.glob(str(model_dir / "plugins" / "profile" / "*" / "*.xplane.pb"))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0
  scalars = summaries.read_scalars(str(model_dir))
  assert scalars["flops_per_step"] == [(2, TINY_LM_FLOPS), (4, TINY_LM_FLOPS)]
  assert 0 < scalars["mfu"][-1][1] < 1
  assert scalars["predicted/compute_fraction"] == [(0, 1.0)]
  memory = scalars.get("max_rss_bytes") or scalars["peak_memory_bytes"]
  assert memory[-1][1] > 1 << 20


def test_dp_mp_run_counts_every_device_once_and_uses_the_gin_peak(tmp_path, capsys):
  """Also with the update in a tf.cond (skip_nonfinite_updates): its dearer branch."""
  model_dir = tmp_path / "model"
  corpus = trainer_helpers.write_corpus(tmp_path)
  run_with(trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=4,
                                            save_every=4) + DP_MP_2X4
           + ["step_metrics.peak_flops_per_second = 1e9",
              "utils.run.skip_nonfinite_updates = True"])
  out = capsys.readouterr().out
  assert "peak 1e+09 FLOP/s (gin step_metrics.peak_flops_per_second)" in out
  assert re.search(r"^predicted step: compute \d+% / communication [1-9]\d*% ", out,
                   re.M)  # 2x4 dp+mp: allreduces
  assert PROGRESS.match(_last_line(out, 4, 4)), out[-3000:]
  assert not os.path.exists(model_dir / "plugins")  # no profile unless asked
  scalars = summaries.read_scalars(str(model_dir))
  assert scalars["flops_per_step"][-1] == (4, TINY_LM_FLOPS)  # 8 devices' slices, once
  steps_per_second = scalars["tokens_per_second"][-1][1] / (8 * 16)
  assert scalars["mfu"][-1][1] == pytest.approx(
      TINY_LM_FLOPS * steps_per_second / 1e9, rel=1e-5)


@pytest.mark.parametrize("backend", ["simd", "gspmd"])
def test_simd_and_gspmd_count_the_whole_model_once(backend, tmp_path, capsys,
                                                    monkeypatch):
  """SIMD stacks every processor's slice; GSPMD's graph is the global program that XLA
  partitions. A profiler that cannot start leaves one warning and a finished run."""
  def refuse(*args, **kwargs):
    raise tf.errors.UnavailableError(None, None, "no profiler plugin")
  monkeypatch.setattr(tf.profiler.experimental, "start", refuse)
  model_dir = tmp_path / "model"
  corpus = trainer_helpers.write_corpus(tmp_path)
  history = run_with(trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=4,
                                                      save_every=4) + DP_MP_2X4
                     + ["make_mesh_impl.backend = %r" % backend,
                        "step_metrics.profile_steps = (1, 2)"])
  assert [s for s, _ in history] == [2, 4]
  out = capsys.readouterr().out
  assert out.count("warning: tf.profiler could not start") == 1, out[-3000:]
  scalars = summaries.read_scalars(str(model_dir))
  assert scalars["flops_per_step"][-1] == (4, TINY_LM_FLOPS)


def test_cpu_memory_is_max_rss_unless_the_allocator_counts_every_tensor(monkeypatch):
  """Without TF_CPU_ALLOCATOR_USE_BFC the CPU allocator counts some tensors (an
  in-memory dataset's) but not oneDNN's: its peak would understate the step."""
  monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC", raising=False)
  memory = step_metrics.Memory([])
  tf.constant(np.ones([512, 1024], np.int32))  # counted by the allocator
  text, scalars = memory.measure()
  assert not memory.supported and "TF_CPU_ALLOCATOR_USE_BFC" in memory.note
  assert re.match(r"^max RSS \d+ MB$", text) and "max_rss_bytes" in scalars
  monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")
  try:
    tf.config.experimental.reset_memory_stats("CPU:0")
    keeps_statistics = True
  except (ValueError, tf.errors.OpError):
    keeps_statistics = False
  assert step_metrics.Memory([]).supported == keeps_statistics


def test_memory_on_cpu_is_the_allocator_peak_or_the_labelled_max_rss():
  memory = step_metrics.Memory([])
  tf.matmul(tf.ones([256, 256]), tf.ones([256, 256]))  # something to count
  text, scalars = memory.measure()
  if not memory.supported:  # no TF_CPU_ALLOCATOR_USE_BFC=true, no oneDNN
    assert "TF_CPU_ALLOCATOR_USE_BFC" in memory.note
  if text.startswith("peak mem "):
    assert memory.supported and scalars["peak_memory_bytes"] > 0
  else:  # no statistics, or an allocator that counted nothing: never "peak mem 0 MB"
    assert re.match(r"^max RSS \d+ MB$", text)
    assert scalars["max_rss_bytes"] > 1 << 20


def test_profile_window_and_a_profiler_that_cannot_start(tmp_path, monkeypatch,
                                                         capsys):
  calls = []
  monkeypatch.setattr(tf.profiler.experimental, "start", calls.append)
  monkeypatch.setattr(tf.profiler.experimental, "stop", lambda: calls.append("stop"))
  profile = step_metrics.Profile(str(tmp_path), (3, 4))
  for step in range(1, 7):
    profile.before_step(step)
    calls.append(step)
    profile.after_step(step)
  assert calls == [1, 2, str(tmp_path), 3, 4, "stop", 5, 6]
  off = step_metrics.Profile(str(tmp_path), None)
  off.before_step(1)
  assert calls[-1] == 6

  def refuse(logdir):
    raise RuntimeError("no profiler plugin")
  monkeypatch.setattr(tf.profiler.experimental, "start", refuse)
  failing = step_metrics.Profile(str(tmp_path), (1, 3))
  for step in (1, 2, 3):
    failing.before_step(step)
    failing.after_step(step)
  assert capsys.readouterr().out.count("could not start") == 1
