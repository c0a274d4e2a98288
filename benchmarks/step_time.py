"""Seconds per train step of issue 16's decoder-only LM: plain TF on one device against
DTensor (tf.experimental.dtensor) on dp / mp / dp+mp and mesh_tf (placement and SIMD
emulation) on one device and dp / mp / dp+mp, over 8 virtual CPUs, with the TF op count
of each traced step (DTensor's before its SPMD expansion, so the plain TF count).

The model is models.tiny_lm (vocab 2048, d_model 256, d_ff 1024, 8 heads x d_kv 32,
2 layers, sequence 128, batch 32, float32, plain SGD); the plain TF side is the same
model written with tf.Variables and tf.GradientTape, from the same weights and data;
DTensor runs that code with DVariables laid out as mesh_tf's rules say (except the
embedding, replicated: DTensor cannot gather along a split dim).
Plain TF is also timed with XLA (jit_compile); `--backends placement,simd,gspmd` adds
mesh_tf's GSPMD backend (compiled with XLA; on CPU it runs unpartitioned). "build s" is
the time to build each step up to its traced graph (mtf graph, lowering, trace), the
median of --build_repeats builds (the first build in a process also pays one-time
set-up, e.g. DTensor's, ~0.15 s); "first call s" the first step after the last build (TF's graph optimization and partitioning, DTensor's SPMD
expansion, XLA's compilation, plus one step).
Each variant is timed in interleaved passes; the best is reported. Smoke tests shrink the
model (--vocab, --d_model, --d_ff, --heads, --d_kv, --num_layers, --batch, --length)
and the meshes (--devices 4).

  python -m benchmarks.step_time [--steps 3 --batch 32 --backends placement,simd,gspmd]
"""
from absl import app
from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_integer, "steps", 3, "Train steps per timed block.")
common.define_flag(flags.DEFINE_integer, "repeats", 2,
                   "Interleaved passes (the best is reported).")
common.define_flag(flags.DEFINE_integer, "batch", 32, "Batch size.")
common.define_flag(flags.DEFINE_integer, "length", 128, "Sequence length.")
common.define_flag(flags.DEFINE_integer, "vocab", 2048, "Vocabulary size.")
common.define_flag(flags.DEFINE_integer, "d_model", 256, "Model width.")
common.define_flag(flags.DEFINE_integer, "d_ff", 1024, "Feed-forward width.")
common.define_flag(flags.DEFINE_integer, "heads", 8, "Attention heads.")
common.define_flag(flags.DEFINE_integer, "d_kv", 32, "Width of each head.")
common.define_flag(flags.DEFINE_integer, "num_layers", 2, "Transformer layers.")
common.define_flag(flags.DEFINE_bool, "dtensor", True,
                   "Also time tf.experimental.dtensor on dp, mp, dp+mp.")
common.define_flag(flags.DEFINE_list, "backends", ["placement", "simd"],
                   "mesh_tf backends to run (placement, simd, gspmd; gspmd steps are "
                   "compiled with XLA).")
common.define_flag(flags.DEFINE_bool, "xla_baseline", True,
                   "Also time plain TF with jit_compile=True.")
common.define_flag(flags.DEFINE_integer, "build_repeats", 3,
                   "Builds of each step; the median is reported.")
common.define_flag(flags.DEFINE_enum, "devices", "8", ["8", "4"],
                   "Virtual CPUs the dp, mp and dp+mp meshes span (4 for smoke tests).")

LAYOUTS = common.mesh_layouts(8)


def make_tf_step(c, weights, make_variable=None, jit_compile=False):
  """The tiny LM in plain TF: tf.function(inputs, targets) -> loss before the update.

  make_variable(name, numpy value) makes each weight (default: a tf.Variable).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  make_variable = make_variable or (lambda name, w: tf.Variable(w))
  v = {k: make_variable(k, w) for k, w in weights.items()}

  def norm(x, scale):
    return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-6) * scale

  def loss_fn(inputs, targets):
    x = tf.gather(v["embedding"], inputs)
    causal = tf.cast(tf.range(c.length)[:, None] < tf.range(c.length)[None, :],
                     tf.float32) * -1e9
    for i in range(c.num_layers):
      p = "layer_%d/" % i
      h = norm(x, v[p + "attn_scale"])
      q = tf.einsum("bld,dhk->blhk", h, v[p + "q"])
      k = tf.einsum("bmd,dhk->bmhk", h, v[p + "k"])
      val = tf.einsum("bmd,dhk->bmhk", h, v[p + "v"])
      logits = tf.einsum("blhk,bmhk->blhm", q, k) + causal[:, None, :]
      attn = tf.einsum("blhm,bmhk->blhk", tf.nn.softmax(logits, -1), val)
      x += tf.einsum("blhk,hkd->bld", attn, v[p + "o"])
      h = norm(x, v[p + "ffn_scale"])
      x += tf.einsum("blf,fd->bld", tf.nn.relu(tf.einsum("bld,df->blf", h, v[p + "wi"])),
                     v[p + "wo"])
    x = norm(x, v["final_scale"])
    logits = tf.einsum("bld,dv->blv", x, v["softmax"])
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits))

  @tf.function(autograph=False, jit_compile=jit_compile)
  def step(inputs, targets):
    with tf.GradientTape() as tape:
      loss = loss_fn(inputs, targets)
    grads = tape.gradient(loss, list(v.values()))
    for var, g in zip(v.values(), grads):
      var.assign_sub(tf.convert_to_tensor(g) * c.learning_rate)
    return loss
  return step


# Weight dims DTensor splits over the "model" mesh dim in mp and dp+mp (mesh_tf's rules).
_DTENSOR_MODEL_DIMS = ("vocab", "heads", "d_ff")


def make_dtensor_step(c, weights, devices, mesh_shape, batch):
  """The plain TF step on a tf.experimental.dtensor mesh; returns (step, args)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.experimental import dtensor  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config  # pylint: disable=g-import-not-at-top
  mesh_dims = [(name, size) for name, size in mesh_shape]
  n = 1
  for _, size in mesh_dims:
    n *= size
  mesh = dtensor.create_mesh(mesh_dims, devices=["CPU:%s" % d.split(":")[-1]
                                                 for d in devices[:n]])
  names = [name for name, _ in mesh_dims]
  shapes = config.weight_shapes(c)

  def place(value, dims, model_parallel=True):
    spec = [dtensor.UNSHARDED] * len(dims)
    for i, d in enumerate(dims):
      if d == "batch" and "batch" in names:
        spec[i] = "batch"
      elif (model_parallel and d in _DTENSOR_MODEL_DIMS and "model" in names and
            "model" not in spec):
        spec[i] = "model"
    replicated = dtensor.copy_to_mesh(tf.constant(value), dtensor.Layout.replicated(
        mesh, len(dims)))
    return dtensor.relayout(replicated, dtensor.Layout(spec, mesh))

  # DTensor cannot gather from a table split along the gathered dim (ResourceGather
  # "does not support sharded 0th dimension"), so its embedding stays replicated.
  step = make_tf_step(c, weights, lambda name, w: dtensor.DVariable(
      place(w, [d for d, _ in shapes[name]], model_parallel=name != "embedding")))
  args = [place(batch[:, :-1], ["batch", "length"]), place(batch[:, 1:], ["batch", "length"])]
  return step, args


def op_count(step, inputs, targets):
  """TF ops in the traced graph of step, nested function bodies included."""
  graph_def = step.get_concrete_function(inputs, targets).graph.as_graph_def()
  return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)


def main(_):
  import gc  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  devices = common.set_up_virtual_cpus(8)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig(batch=FLAGS.batch, length=FLAGS.length, vocab=FLAGS.vocab,
                          d_model=FLAGS.d_model, heads=FLAGS.heads, d_kv=FLAGS.d_kv,
                          d_ff=FLAGS.d_ff, num_layers=FLAGS.num_layers,
                          learning_rate=0.05)
  weights = config.initial_weights(c)
  batch = config.synthetic_batch(c)
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  steps, build = {}, {}

  def add(label, make):
    """Builds one variant; its build time is the graph, lowering and trace (median of
    the repeats). Each build starts from a collected heap: a full collection of this
    process's heap takes about 0.2 s and would otherwise land in whichever build crosses
    the collector's threshold."""
    times = []
    for _ in range(max(FLAGS.build_repeats, 1)):
      gc.collect()
      start = time.perf_counter()
      steps[label] = make()
      steps[label][0].get_concrete_function(*steps[label][1])
      times.append(time.perf_counter() - start)
    build[label] = sorted(times)[len(times) // 2]

  add("plain TF single", lambda: (make_tf_step(c, weights), [inputs, targets]))
  if FLAGS.xla_baseline:
    add("plain TF single XLA", lambda: (make_tf_step(c, weights, jit_compile=True),
                                        [inputs, targets]))
  meshes = common.mesh_layouts(int(FLAGS.devices))
  if FLAGS.dtensor:
    for label, mesh_shape, _ in meshes[1:]:
      dims = [(d.name, d.size) for d in mtf.convert_to_shape(mesh_shape).dims]
      add("DTensor %s" % label, lambda dims=dims: make_dtensor_step(
          c, weights, devices, dims, batch))
  for backend in FLAGS.backends:
    for label, mesh_shape, layout in meshes:
      def make(backend=backend, mesh_shape=mesh_shape, layout=layout):
        model = mtf_model.TinyLmModel(c, weights)
        n = mtf.convert_to_shape(mesh_shape).size
        impl = mtf.make_mesh_impl(backend, mesh_shape, layout, devices[:max(n, 1)])
        return model.make_train_step(impl, jit_compile=impl.needs_xla), [inputs, targets]
      add("mesh_tf %s %s" % (backend, label), make)
  first_loss, first_call = {}, {}
  for k, (s, a) in steps.items():
    start = time.perf_counter()
    first_loss[k] = float(s(*a))
    first_call[k] = time.perf_counter() - start
  ops = {k: op_count(s, *a) for k, (s, a) in steps.items()}
  fns = {k: (lambda s=s, a=a: s(*a)) for k, (s, a) in steps.items()}
  times = {k: min(v) for k, v in _best_of(fns, FLAGS.steps, FLAGS.repeats).items()}
  print(common.machine_line())
  print("LM %s; %s virtual CPUs; %d steps per block, best of %d interleaved passes"
        % (dict(c._asdict()), FLAGS.devices, FLAGS.steps, FLAGS.repeats))
  base = times["plain TF single"]
  rows = [["variant", "s/step", "ratio to plain TF", "TF ops", "build s", "first call s",
           "first loss"]]
  for k, t in times.items():
    rows.append([k, "%.3f" % t, "%.2f" % (t / base), "%d" % ops[k], "%.2f" % build[k],
                 "%.2f" % first_call[k], "%.5f" % first_loss[k]])
  common.print_table(rows)


def _best_of(fns, steps, repeats):
  """{label: [seconds per step of each pass]}, passes interleaving the fns."""
  import time  # pylint: disable=g-import-not-at-top
  samples = {k: [] for k in fns}
  for _ in range(repeats):
    for k, fn in fns.items():
      start = time.perf_counter()
      for _ in range(steps):
        out = fn()
      out.numpy()
      samples[k].append((time.perf_counter() - start) / steps)
  return samples


if __name__ == "__main__":
  app.run(main)
