"""A pipelined LM (mtf.layers.pipeline) against the same LM split by model parallelism,
on the same 8 virtual CPU devices: step time, bytes per step and memory per device.

The LM is attention-free: an embedding, L residual blocks x + relu(norm(x) wi) wo
(RMS norm with a learned scale), a final norm and a softmax layer, trained with Adam.

- "mp" (the baseline): no pipeline; mesh model:8, rules d_ff:model;vocab:model.
- "pipe S=s M=m": the L blocks as an s-stage pipeline of m microbatches (L/s blocks per
  stage; every block weight carries `stages`); mesh stage:s;model:8/s, rules
  stages:stage;d_ff:model;vocab:model. The embedding and softmax sit outside the
  pipeline, split over `model` only.

Every variant starts from the same weights and data, so their first losses agree (the
last column). Columns:

- ms/step, vs mp: median seconds per train step (placement backend, one traced
  tf.function each) and its ratio to the baseline's, timed in alternating rounds.
- sent B/proc rec, pred: bytes each processor sends per step, from the placement
  backend's record of the collectives its trace emitted (Lowering.comm_records) and
  from mtf.analysis.estimate_cost. "stage B" is the part over the `stage` mesh dim: the
  buffer's shifts (one neighbour's slice received per shift, forward and backward) and
  one allreduce of a microbatch per microbatch leaving the last stage (forward) or
  entering stage 0 (backward).
- flops/proc vs mp: estimate_cost's FLOPs per processor over the baseline's.
- bubble, extra work: every iteration runs every stage, and of the (M+S-1) S stage slots
  (S-1) S hold no microbatch: "bubble" is (S-1)/(M+S-1); "extra work" is the work the
  pipelined step does beyond the plain LM's, 1 - FLOPs(mp) / FLOPs(pipe), both counted
  by estimate_cost on one device (the embedding, softmax and Adam are not repeated, the
  stage masks add a little).
- w+slots B/dev, pred, vs mp: bytes of one processor's slice variables (weights and
  Adam slots, counted from the TF variables), predict_memory's figure, and the ratio
  to the baseline. The blocks' weights are split 8 ways in both (stages x model); the
  embedding and softmax 8 / S ways in the pipelines.
- peak/dev pred vs mp: predict_memory's per-device peak over the baseline's.
- proc act pred vs mp, alloc peak vs mp: all 8 virtual devices share one process and
  one allocator, so the measured figure is the process allocator's peak during one step
  above what it held before (the script sets TF_CPU_ALLOCATOR_USE_BFC=true before TF
  starts; "-" without it), and the prediction beside it is predict_memory's activation
  bytes of the process (each distinct slice once); both over the baseline's.

On a CPU all "devices" share the machine's cores, so a pipeline cannot run its stages
at the same time as on separate accelerators: the step time shows the work done, not
the overlap. The bubble and the bytes are what carry over to real hardware.

  python -m benchmarks.pipeline [--size tiny|default --steps 2 --repeats 3
      --stages 2,4 --microbatches 1,2,4,8]

(--nooptimize_graph skips Grappler and --notf_function lowers every step eagerly: both
only make smoke runs quicker.)
"""
import os

from absl import app
from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS


def define_flags():
  """The script's flags (defined only when it runs as a script, so that tests may
  import this module beside other benchmarks that define flags of the same names)."""
  common.define_flag(flags.DEFINE_string, "size", "default",
                     "Model size: tiny (smoke test) or default.")
  common.define_flag(flags.DEFINE_list, "stages", ["2", "4"],
                     "Numbers of pipeline stages S.")
  common.define_flag(flags.DEFINE_list, "microbatches", ["1", "2", "4", "8"],
                     "Numbers of microbatches M.")
  common.define_flag(flags.DEFINE_integer, "steps", 2, "Train steps per timed block.")
  common.define_flag(flags.DEFINE_integer, "repeats", 3,
                     "Timed rounds (the median is reported).")
  common.define_flag(flags.DEFINE_bool, "optimize_graph", True,
                     "Let Grappler optimize the steps' graphs "
                     "(--nooptimize_graph: quicker first calls, for smoke tests).")
  common.define_flag(flags.DEFINE_bool, "tf_function", True,
                     "Trace each step once in a tf.function; "
                     "--notf_function lowers every step eagerly (no trace, and no "
                     "allocator peak).")


def main(_):
  run(FLAGS.size, [int(x) for x in FLAGS.stages], [int(x) for x in FLAGS.microbatches],
      FLAGS.steps, FLAGS.repeats, FLAGS.optimize_graph, FLAGS.tf_function)


SIZES = {
    "tiny": dict(batch=8, length=4, vocab=32, d_model=16, d_ff=32, num_layers=4),
    "default": dict(batch=32, length=32, vocab=512, d_model=256, d_ff=1024,
                    num_layers=8),
}
NUM_DEVICES = 8
LEARNING_RATE = 0.001
BASELINE = ("model:8", "d_ff:model;vocab:model")


def pipeline_layout(num_stages):
  """(mesh shape, rules) of the pipelined LM with num_stages stages on 8 devices."""
  return ("stage:%d;model:%d" % (num_stages, NUM_DEVICES // num_stages),
          "stages:stage;d_ff:model;vocab:model")


def initial_weights(s, seed=0):
  """{name: numpy array}: the LM's weights, block l's named block_<l>/..."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  d, f, v = s["d_model"], s["d_ff"], s["vocab"]
  w = {"embedding": rng.normal(0, 1, [v, d]), "final_scale": np.ones([d]),
       "softmax": rng.normal(0, d ** -0.5, [d, v])}
  for i in range(s["num_layers"]):
    w["block_%d/scale" % i] = 1 + 0.1 * rng.normal(0, 1, [d])
    w["block_%d/wi" % i] = rng.normal(0, d ** -0.5, [d, f])
    w["block_%d/wo" % i] = rng.normal(0, f ** -0.5, [f, d]) * 0.5
  return {k: a.astype(np.float32) for k, a in w.items()}


def _rms_norm(mtf, x, scale, dim):
  return x * mtf.rsqrt(mtf.reduce_mean(mtf.square(x), reduced_dim=dim) + 1e-6) * scale


class PipelineLm:
  """The LM's train step as an mtf graph; pipelined when num_stages is given.

  Attributes: graph, mesh, inputs, targets ([batch, length] int32 placeholders), loss,
  update_ops, stage_calls (stage_fn applications of the pipeline; 0 without one).
  """

  def __init__(self, s, num_stages=None, num_microbatches=1, weights=None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
    weights = weights if weights is not None else initial_weights(s)
    self.graph = graph = mtf.Graph()
    self.mesh = mesh = mtf.Mesh(graph, "mesh")
    dim = mtf.Dimension
    batch, length = dim("batch", s["batch"]), dim("length", s["length"])
    d_model, d_ff, vocab = dim("d_model", s["d_model"]), dim("d_ff", s["d_ff"]), dim(
        "vocab", s["vocab"])

    def variable(name, dims, value):
      return mtf.get_variable(mesh, name, dims, initializer=(
          lambda shape, dtype, v=value, **_: tf.constant(v, dtype)))

    spec = tf.TensorSpec([s["batch"], s["length"]], tf.int32)
    self.inputs = mtf.import_tf_tensor(mesh, spec, [batch, length], name="inputs")
    self.targets = mtf.import_tf_tensor(mesh, spec, [batch, length], name="targets")
    x = mtf.gather(variable("embedding", [vocab, d_model], weights["embedding"]),
                   self.inputs, vocab)

    def block(h, scale, wi, wo):
      n = _rms_norm(mtf, h, scale, d_model)
      return h + mtf.einsum([mtf.relu(mtf.einsum([n, wi], reduced_dims=[d_model])), wo],
                            output_shape=h.shape)

    num_layers = s["num_layers"]
    self.stage_calls = 0
    if num_stages is None:
      for i in range(num_layers):
        p = "block_%d/" % i
        x = block(x, variable(p + "scale", [d_model], weights[p + "scale"]),
                  variable(p + "wi", [d_model, d_ff], weights[p + "wi"]),
                  variable(p + "wo", [d_ff, d_model], weights[p + "wo"]))
    else:
      import numpy as np  # pylint: disable=g-import-not-at-top
      stages = dim("stages", num_stages)
      per_stage = num_layers // num_stages
      blocks = []
      for b in range(per_stage):  # block b of stage k is layer k * per_stage + b
        layer = lambda n, b=b: np.stack([weights["block_%d/%s" % (
            k * per_stage + b, n)] for k in range(num_stages)])
        p = "stage_block_%d/" % b
        blocks.append((variable(p + "scale", [stages, d_model], layer("scale")),
                       variable(p + "wi", [stages, d_model, d_ff], layer("wi")),
                       variable(p + "wo", [stages, d_ff, d_model], layer("wo"))))

      def stage_fn(h, repeat):
        del repeat
        self.stage_calls += 1
        for scale, wi, wo in blocks:
          h = block(h, scale, wi, wo)
        return h
      x = mtf.layers.pipeline(stage_fn, x, stages, "microbatch",
                              num_microbatches=num_microbatches)
    x = _rms_norm(mtf, x, variable("final_scale", [d_model], weights["final_scale"]),
                  d_model)
    logits = mtf.einsum([x, variable("softmax", [d_model, vocab], weights["softmax"])],
                        reduced_dims=[d_model])
    xent = mtf.layers.softmax_cross_entropy_with_logits(
        logits, mtf.one_hot(self.targets, vocab), vocab)
    self.loss = mtf.reduce_mean(xent)
    variables = graph.trainable_variables
    grads = mtf.gradients([self.loss], [v.outputs[0] for v in variables])
    optimizer = mtf.optimize.AdamWeightDecayOptimizer(learning_rate=LEARNING_RATE)
    self.update_ops = optimizer.apply_grads(grads, variables)
    self.trainable_names = {v.name for v in variables}

  @property
  def fetches(self):
    return [self.loss] + self.update_ops

  def lowering(self, mesh_impl, inputs=None, targets=None):
    import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
    feeds = {} if inputs is None else {self.inputs: inputs, self.targets: targets}
    return mtf.Lowering(self.graph, {self.mesh: mesh_impl}, feeds=feeds)


def synthetic_batch(s, seed=1):
  """(inputs, targets) int32 arrays [batch, length]: next-token pairs of random ids."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  ids = np.random.RandomState(seed).randint(0, s["vocab"], [s["batch"], s["length"] + 1])
  return ids[:, :-1].astype(np.int32), ids[:, 1:].astype(np.int32)


def variable_bytes_per_device(mesh_impl, trainable_names):
  """(weights, slots) bytes of one processor's slice variables (placement backend)."""
  out = [0, 0]
  for name, lv in mesh_impl.variable_store.items():
    v = lv.slice_variables[0]
    out[0 if name in trainable_names else 1] += v.shape.num_elements() * v.dtype.size
  return tuple(out)


def variants(stages, microbatches):
  """[(label, S or None, M)]: the baseline first, then every pipeline."""
  return [("mp", None, 1)] + [("pipe S=%d M=%d" % (s, m), s, m)
                              for s in stages for m in microbatches]


def measure(devices, s, weights, batch, num_stages, num_microbatches, tf_function=True):
  """Builds one variant, runs its first step and returns (step fn, figures)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tf import analysis  # pylint: disable=g-import-not-at-top
  from models import train_steps  # pylint: disable=g-import-not-at-top
  model = PipelineLm(s, num_stages, num_microbatches, weights)
  mesh_shape, rules = BASELINE if num_stages is None else pipeline_layout(num_stages)
  impl = mtf.make_mesh_impl("placement", mesh_shape, rules, devices[:NUM_DEVICES])
  model.lowering(impl)  # the variables, eagerly
  lowerings = []

  def run(inputs, targets):
    lowering = model.lowering(impl, inputs, targets)
    lowerings.append(lowering)
    return train_steps.lower_train_step(lowering, model.loss, model.update_ops)
  step = tf.function(run, autograph=False) if tf_function else run
  first_loss = float(step(*batch))
  records = list(lowerings[0].comm_records)  # what the first lowering (trace) emitted
  alloc_peak = None
  if tf_function:
    try:  # TF_CPU_ALLOCATOR_USE_BFC=true before TF started, or no allocator figures
      before = tf.config.experimental.get_memory_info("CPU:0")["current"]
      tf.config.experimental.reset_memory_stats("CPU:0")
      step(*batch).numpy()
      alloc_peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
    except ValueError:
      pass
  cost = analysis.estimate_cost(model.graph, mesh_shape, rules, fetches=model.fetches)
  single = analysis.estimate_cost(model.graph, "", "", fetches=model.fetches)
  memory = analysis.predict_memory(model.graph, mesh_shape, rules, fetches=model.fetches)
  stage_axis = 0 if num_stages else None
  weights_dev, slots_dev = variable_bytes_per_device(impl, model.trainable_names)
  figures = dict(
      first_loss=first_loss,
      sent_recorded=analysis.total_bytes_per_processor(records),
      sent_predicted=cost.comm_bytes_per_processor,
      stage_recorded=analysis.total_bytes_per_processor(
          [r for r in records if stage_axis in r.mesh_axes]),
      stage_predicted=analysis.total_bytes_per_processor(
          [r for r in cost.comm_records if stage_axis in r.mesh_axes]),
      flops=cost.flops_per_processor, flops_single=single.flops_per_processor,
      stage_calls=model.stage_calls, state_bytes=weights_dev + slots_dev,
      state_predicted=memory.weight_bytes + memory.slot_bytes,
      peak_predicted=memory.peak_bytes,
      process_activations_predicted=memory.process_activation_bytes,
      alloc_peak=alloc_peak)
  return (lambda: step(*batch)), figures


def run(size="default", stages=(2, 4), microbatches=(1, 2, 4, 8), steps=2, repeats=3,
        optimize_graph=True, tf_function=True):
  """Measures every variant and prints the table (see the module docstring)."""
  devices = common.set_up_virtual_cpus(NUM_DEVICES)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.get_logger().setLevel("ERROR")  # each variant is its own tf.function: no retracing
  options = tf.config.optimizer.get_experimental_options()
  if not optimize_graph:
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
  try:
    s = SIZES[size]
    weights = initial_weights(s)
    batch = tuple(tf.constant(a) for a in synthetic_batch(s))
    fns, figs = {}, {}
    for label, num_stages, m in variants(stages, microbatches):
      fns[label], figs[label] = measure(devices, s, weights, batch, num_stages, m,
                                        tf_function)
    times = common.time_alternating(fns, steps, repeats)
  finally:
    tf.config.optimizer.set_experimental_options(
        dict(options, disable_meta_optimizer=options.get("disable_meta_optimizer",
                                                         False)))
  print(common.machine_line())
  print("attention-free LM %s, Adam, placement backend on %d virtual CPU devices; "
        "%d steps x %d rounds, median per step" % (s, NUM_DEVICES, steps, repeats))
  print("mp: mesh %s rules %s; pipe S=s: mesh %s rules %s" % (
      BASELINE + ("stage:s;model:8/s",) + (pipeline_layout(2)[1],)))
  base = figs["mp"]
  rows = [["variant", "ms/step", "vs mp", "sent B/proc rec", "sent B/proc pred",
           "stage B rec", "stage B pred", "flops/proc vs mp", "bubble", "extra work",
           "w+slots B/dev", "pred", "vs mp", "peak/dev pred vs mp",
           "proc act pred vs mp", "alloc peak vs mp", "first loss"]]
  for label, f in figs.items():
    m = 1 if label == "mp" else int(label.split("M=")[1])
    num_stages = None if label == "mp" else int(label.split("S=")[1].split()[0])
    if num_stages is None:
      bubble = extra = "-"
    else:
      bubble = "%.3f" % ((num_stages - 1.0) / (m + num_stages - 1))
      # Work beyond the plain LM's, counted in the one-device program (its FLOPs) ...
      extra = "%.3f" % (1 - base["flops_single"] / f["flops_single"])
      # ... and by the stage_fn applications: M of the (M+S-1) run real microbatches.
      assert f["stage_calls"] == m + num_stages - 1
    rows.append([
        label, "%.1f" % (1e3 * times[label]), "%.2f" % (times[label] / times["mp"]),
        "%.0f" % f["sent_recorded"], "%.0f" % f["sent_predicted"],
        "%.0f" % f["stage_recorded"], "%.0f" % f["stage_predicted"],
        "%.2f" % (f["flops"] / base["flops"]), bubble, extra,
        "%d" % f["state_bytes"], "%d" % f["state_predicted"],
        "%.2f" % (f["state_bytes"] / base["state_bytes"]),
        "%.2f" % (f["peak_predicted"] / base["peak_predicted"]),
        "%.2f" % (f["process_activations_predicted"] /
                  base["process_activations_predicted"]),
        "-" if f["alloc_peak"] is None else "%.2f" % (
            f["alloc_peak"] / max(base["alloc_peak"], 1)),
        "%.6f" % f["first_loss"]])
  common.print_table(rows)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # before TF starts
  define_flags()
  app.run(main)
