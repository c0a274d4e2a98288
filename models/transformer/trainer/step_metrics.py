"""What the trainers report besides loss and tokens/s: model FLOPs utilization (MFU),
peak memory, the cost model's compute/communication split, and an opt-in profile
(README.md, "What the progress line shows").

FLOPs per step are counted once from the traced step's TF graph: 2*M*N*K for every
matmul-like op with static shapes that the step's outputs and updates need. A function
counts once per call, cond and case their dearest branch, a while loop its body once;
an SPMD process's replica graph counts once per replica of that process.
"""
from concurrent import futures
import os
import resource
import sys
import time

import gin
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as eager_context
from tensorflow.python.framework import function_def_to_graph

from mesh_tf import cpu_threads

_MB = 1 << 20


@gin.configurable("step_metrics")
def options(peak_flops_per_second=None, profile_steps=None):
  """gin: `step_metrics.peak_flops_per_second = 1e12` (the FLOP/s the MFU divides by,
  instead of a start-up calibration); `step_metrics.profile_steps = (10, 12)` (trace
  global steps 10 to 12 with tf.profiler into model_dir; None: off)."""
  return {"peak_flops_per_second": peak_flops_per_second, "profile_steps": profile_steps}


# Ops that call functions: {type: (attrs naming the functions, index of the first
# input the callee gets)}.
_CALLS = {"PartitionedCall": (("f",), 0), "StatefulPartitionedCall": (("f",), 0),
          "While": (("body",), 0), "StatelessWhile": (("body",), 0),
          "If": (("then_branch", "else_branch"), 1),
          "StatelessIf": (("then_branch", "else_branch"), 1),
          "Case": (("branches",), 1), "StatelessCase": (("branches",), 1)}


def _dims(tensor):
  return tensor.shape.as_list() if tensor.shape.is_fully_defined() else None


def _einsum_flops(equation, shapes):
  """2 x the product of every index's size, for a two-operand einsum."""
  inputs = equation.replace(" ", "").split("->")[0].split(",")
  if len(inputs) != 2:
    return 0.0
  sizes = {}
  for spec, shape in zip(inputs, shapes):
    if "..." in spec:
      head, tail = spec.split("...")
      width = len(shape) - len(head) - len(tail)
      spec = head + "".join(chr(0x100 + width - i) for i in range(width)) + tail
    for letter, size in zip(spec, shape):
      sizes[letter] = max(sizes.get(letter, 1), size)
  return 2.0 * float(np.prod(list(sizes.values()), dtype=np.float64))


def op_flops(op):
  """FLOPs of one matmul-like TF op (0 for others); None where shapes are unknown."""
  kind = op.type
  if not (kind in ("MatMul", "Einsum") or kind.startswith(("BatchMatMul", "Conv",
                                                           "DepthwiseConv"))):
    return 0.0
  ins = [_dims(x) for x in op.inputs]
  out = _dims(op.outputs[0])
  if out is None or any(s is None for s in ins):
    return None
  size = float(np.prod(out, dtype=np.float64))
  if kind == "MatMul":
    return 2.0 * size * ins[0][0 if op.get_attr("transpose_a") else 1]
  if kind.startswith("BatchMatMul"):
    return 2.0 * size * ins[0][-2 if op.get_attr("adj_x") else -1]
  if kind == "Einsum":
    return _einsum_flops(op.get_attr("equation").decode(), ins)
  # a convolution: 2 x output elements x the filter taps each one sums (the filter's
  # window and input channels; depthwise: its window only)
  kept = -2 if kind.startswith("DepthwiseConv") else -1
  if "BackpropInput" in kind:  # (input or its sizes, filter, out_backprop)
    return 2.0 * float(np.prod(ins[2])) * float(np.prod(ins[1][:kept]))
  if "BackpropFilter" in kind:  # (input, filter_sizes, out_backprop) -> filter
    return 2.0 * float(np.prod(ins[2])) * float(np.prod(out[:kept]))
  if kind in ("Conv2D", "Conv3D", "Conv", "DepthwiseConv2dNative"):
    return 2.0 * size * float(np.prod(ins[1][:kept]))
  return 0.0


class FlopCounter:
  """Sums op_flops over a graph and, once per call, the functions it calls."""

  def __init__(self):
    self.unknown = 0  # matmul-like ops without static shapes (counted as 0)
    self.loops = 0  # while loops (bodies counted once)
    self._cache = {}

  def count(self, graph):
    total = 0.0
    for op in live_operations(graph):
      if op.type in _CALLS:
        attrs, first = _CALLS[op.type]
        functions = []
        for attr in attrs:
          value = op.get_attr(attr)
          functions += value if isinstance(value, list) else [value]
        shapes = [x.shape for x in op.inputs[first:]]
        self.loops += op.type.endswith("While")
        total += max(self._called(graph, f.name, shapes) for f in functions)
        continue
      flops = op_flops(op)
      if flops is None:
        self.unknown += 1
      else:
        total += flops
    return total

  def _called(self, graph, name, shapes):
    key = (name, tuple(str(s) for s in shapes))
    if key not in self._cache:
      self._cache[key] = self.count(_function_graph(graph, name, shapes))
    return self._cache[key]


def live_operations(graph):
  """The ops of a function graph that its outputs or control outputs (variable
  updates) need: the runtime prunes the rest."""
  roots = list(getattr(graph, "outputs", None) or ()) + list(
      getattr(graph, "control_outputs", None) or ())
  if not roots:
    return graph.get_operations()
  live, stack = set(), [getattr(r, "op", r) for r in roots]
  while stack:
    op = stack.pop()
    if op in live:
      continue
    live.add(op)
    stack.extend(x.op for x in op.inputs)
    stack.extend(op.control_inputs)
  return [op for op in graph.get_operations() if op in live]


def _function_graph(graph, name, shapes):
  """The graph of function `name`, from the graph's library or the eager context."""
  fdef = None
  while graph is not None and fdef is None:
    found = graph._get_function(name)  # pylint: disable=protected-access
    fdef = getattr(found, "cached_definition", None) or getattr(found, "definition",
                                                                found)
    graph = getattr(graph, "outer_graph", None)
  if fdef is None:
    fdef = eager_context.context().get_function_def(name)
  return function_def_to_graph.function_def_to_graph(fdef, input_shapes=shapes)


def graph_flops(graph, notes=None):
  """(FLOPs, matmul-like ops of unknown shape) of one run of a TF graph; appends
  what the count leaves out to the list `notes`, if given."""
  counter = FlopCounter()
  flops = counter.count(graph)
  if notes is not None and counter.loops:
    notes.append("while loops counted as one iteration each (microbatches, say: "
                 "their trip counts are not in the graph)")
  if notes is not None and counter.unknown:
    notes.append("%d matmul op(s) of unknown shape left out" % counter.unknown)
  return flops, counter.unknown


_measured = {}  # (device, size) -> FLOP/s: one calibration per process and device


def measure_peak_flops(device=None, size=2048, budget_seconds=0.8):
  """FLOP/s of float32 size x size matmuls on one device, measured once per process and
  device: the best round (others may share the host's cores) of those that fit in
  budget_seconds after a warm-up. A round is ten matmuls on a GPU; on a CPU it is one
  matmul per group of intra-op threads the process's cores hold (mesh_tf.cpu_threads),
  run side by side, so a pool of one thread per op still measures every core."""
  key = (device, size)
  if key not in _measured:
    on_cpu = device is None or "CPU" in device.upper()
    per_round = 10 if not on_cpu else 1
    side_by_side = (max(1, cpu_threads.host_cores() // cpu_threads.intra_op_threads())
                    if on_cpu else 1)
    with tf.device(device or "/CPU:0"):
      a, b = tf.random.uniform([size, size]), tf.random.uniform([size, size])

      def matmuls(_=None):
        with tf.device(device or "/CPU:0"):
          for _ in range(per_round):
            c = tf.matmul(a, b)
          return float(c[0, 0])

      matmuls()  # warm-up: kernels, threads, buffers
      with futures.ThreadPoolExecutor(side_by_side) as pool:
        best, start = 0.0, time.perf_counter()
        while True:
          began = time.perf_counter()
          list(pool.map(matmuls, range(side_by_side)))
          took = time.perf_counter() - began
          best = max(best, 2.0 * size ** 3 * per_round * side_by_side / took)
          if time.perf_counter() - start + took > budget_seconds:
            break
    _measured[key] = best
  return _measured[key]


def mesh_gpus(mesh_impls):
  """The distinct GPUs the mesh impls compute on: their named devices, else (SIMD,
  GSPMD on the default device) the first visible GPU, if any."""
  names = []
  for impl in mesh_impls:
    names += [str(d) for d in (getattr(impl, "devices", None) or ()) if d]
    names += [str(getattr(impl, "device", "") or "")]
  def gpus_of(names):
    specs = [tf.DeviceSpec.from_string(n) for n in names]
    return sorted({"GPU:%d" % (s.device_index or 0) for s in specs
                   if (s.device_type or "").upper() == "GPU"})
  return gpus_of(names) or gpus_of(
      [d.name for d in tf.config.list_logical_devices("GPU")[:1]])


def _cpu_allocator_counts_all():
  """Whether TF_CPU_ALLOCATOR_USE_BFC is set: only then do the CPU allocator's
  statistics count every tensor (without it they may count a few, e.g. an in-memory
  dataset's, but not the step's, which oneDNN allocates)."""
  return os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").strip().lower() in ("1", "true")


class Memory:
  """Peak allocator bytes per device, or the process's max RSS where devices keep no
  statistics (CPU in TF 2.21 without TF_CPU_ALLOCATOR_USE_BFC=true)."""

  def __init__(self, gpus):
    self.devices = gpus or ["CPU:0"]
    self.note = None
    self.supported = bool(gpus) or _cpu_allocator_counts_all()
    if self.supported:
      try:
        for d in self.devices:
          tf.config.experimental.reset_memory_stats(d)
      except (ValueError, tf.errors.OpError):
        self.supported = False
    if self.supported and not gpus:
      self.note = ("peak mem: one CPU allocator serves every CPU device, so the line "
                   "shows its peak (all devices)")
    elif not self.supported:
      self.note = ("peak mem: CPU devices keep no full allocator statistics in TF %s "
                   "(set TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts for them); "
                   "the line shows the process's max RSS" % tf.__version__)

  def measure(self):
    """(text for the progress line, {scalar name: value}): the devices' peak, or the
    process's max RSS where they keep no statistics or counted nothing (the peak stays 0
    where the kernels allocate outside TF's allocator, as oneDNN's did on an AMD host)."""
    peak = 0
    if self.supported:
      peak = max(tf.config.experimental.get_memory_info(d)["peak"] for d in self.devices)
    if not peak:
      rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      rss *= 1 if sys.platform == "darwin" else 1024  # Linux reports KiB
      return "max RSS %.0f MB" % (rss / _MB), {"max_rss_bytes": rss}
    where = "/dev" if self.devices != ["CPU:0"] else " (CPU, all devices)"
    return "peak mem %.0f MB%s" % (peak / _MB, where), {"peak_memory_bytes": peak}


def predicted_split(model_graph, mesh_shape, layout_rules, flops_per_processor_second,
                    on_gpu):
  """The cost model's (compute seconds, communication seconds, profile name) per
  processor of one step, with the hardware profile's compute rate replaced by
  flops_per_processor_second."""
  from mesh_tf.auto_mtf import hardware  # pylint: disable=g-import-not-at-top
  from mesh_tf.auto_mtf import step_time  # pylint: disable=g-import-not-at-top
  profile = (hardware.GPU_H100 if on_gpu else hardware.TPU_V3
             if tf.config.list_logical_devices("TPU") else hardware.CPU_HOST)
  profile = profile._replace(flops_per_second=flops_per_processor_second)
  model = step_time.StepTimeModel(
      model_graph.graph, [model_graph.loss] + list(model_graph.update_ops), profile)
  prediction = model.evaluate(mesh_shape, layout_rules)
  return prediction.compute_time, prediction.comm_time, profile.name


class Profile:
  """A tf.profiler trace of global steps first..last (1-based, inclusive) into logdir."""

  def __init__(self, logdir, steps):
    self.logdir = logdir
    self.first, self.last = (int(s) for s in steps) if steps else (0, -1)
    self.running = False
    self.done = not steps

  def before_step(self, step):
    """Starts the trace if the step about to run (`step`, 1-based) is in range."""
    if self.done or self.running or not self.first <= step <= self.last:
      return
    try:
      tf.profiler.experimental.start(self.logdir)
      self.running = True
      print("profiling steps %d-%d into %s" % (step, self.last, self.logdir), flush=True)
    except Exception as e:  # pylint: disable=broad-except  # a missing plugin, say
      print("warning: tf.profiler could not start (%s: %s); training goes on without "
            "a profile" % (type(e).__name__, e), flush=True)
      self.done = True

  def after_step(self, step, force=False):
    """Stops the trace after step `last` (or now, with force: the run ends)."""
    if self.running and (step >= self.last or force):
      self.running, self.done = False, True
      try:
        tf.profiler.experimental.stop()
      except Exception as e:  # pylint: disable=broad-except
        print("warning: tf.profiler could not stop (%s: %s)" % (type(e).__name__, e),
              flush=True)


class StepMetrics:
  """MFU, memory, predicted split and the profile of one training run. mesh_impl is
  the run's MeshImpl (in SPMD: one replica's, and replica_impls are this process's);
  logdir is where the profile goes (None: no profile)."""

  def __init__(self, model_graph, mesh_impl, logdir=None, replica_impls=None):
    settings = options()
    self.replicas = len(replica_impls) if replica_impls else 1  # traced programs
    self.processors = sum(len(i.devices) for i in replica_impls) if replica_impls else None
    gpus = mesh_gpus(replica_impls or [mesh_impl])
    self.peak = settings["peak_flops_per_second"]
    source = "gin step_metrics.peak_flops_per_second"
    if not self.peak and not gpus and tf.config.list_logical_devices("TPU"):
      print("MFU n/a: bind step_metrics.peak_flops_per_second to the TPU cores' peak "
            "(only CPUs and GPUs are timed)", flush=True)
    elif not self.peak:
      per_device = measure_peak_flops(gpus[0] if gpus else None)
      self.peak = per_device * max(len(gpus), 1)
      source = ("%d GPU(s) x %.3g FLOP/s" % (len(gpus), per_device) if gpus else
                "the host's float32 2048x2048 matmul rate")
    self.memory = Memory(gpus)
    self.flops_per_step = None
    self.profile = Profile(logdir, settings["profile_steps"] if logdir else None)
    if self.peak:
      print("peak %.3g FLOP/s (%s)" % (self.peak, source), flush=True)
    if self.memory.note:
      print(self.memory.note, flush=True)
    self.predicted = {}
    if self.peak:
      self._predict(model_graph, mesh_impl, gpus, replica_impls)

  def _predict(self, model_graph, mesh_impl, gpus, replica_impls):
    """Prints (and keeps for TensorBoard) the cost model's split of one step."""
    try:
      # the processors this process's peak serves: the mesh (SPMD: its replicas)
      rate = self.peak / (self.processors or mesh_impl.shape.size)
      compute, comm, profile = predicted_split(
          model_graph, mesh_impl.shape, mesh_impl.layout_rules, rate, bool(gpus))
      total = max(compute + comm, 1e-30)
      print("predicted step: compute %.0f%% / communication %.0f%% (cost model, "
            "profile %s at %.3g FLOP/s per processor: %.3g s + %.3g s)"
            % (100 * compute / total, 100 * comm / total, profile, rate, compute, comm),
            flush=True)
      self.predicted = {"predicted/compute_seconds": compute,
                        "predicted/communication_seconds": comm,
                        "predicted/compute_fraction": compute / total}
    except Exception as e:  # pylint: disable=broad-except  # a report, not the run
      print("predicted step: n/a (cost model: %s)" % e, flush=True)

  def before_step(self, step):
    """Call before global step `step` (1-based) runs: starts a profile if due."""
    self.profile.before_step(step)

  def after_step(self, step, step_function, *args):
    """Call after step `step` ran step_function(*args) (a tf.function): stops a due
    profile and, the first time, counts the FLOPs of the step's traced graph."""
    self.profile.after_step(step)
    if self.flops_per_step is None:
      try:
        graph = step_function.get_concrete_function(*args).graph  # the trace just run
        notes = []
        flops, _ = graph_flops(graph, notes)
      except Exception as e:  # pylint: disable=broad-except  # a report, not the run
        self.flops_per_step = 0.0
        print("MFU n/a: counting the step's FLOPs failed (%s: %s)"
              % (type(e).__name__, e), flush=True)
        return
      self.flops_per_step = flops * self.replicas
      print("%.4g FLOPs per step (matmuls, einsums and convolutions of the traced "
            "step%s)" % (self.flops_per_step, self._programs()), flush=True)
      for note in notes:
        print("MFU: %s" % note, flush=True)

  def _programs(self):
    """"; 4 replicas" (one traced program each), "; 4 processors in one program", or
    nothing outside SPMD."""
    if self.replicas > 1:
      return "; %d replicas" % self.replicas
    return "; %d processors in one program" % self.processors if self.processors else ""

  def close(self, step):
    """Stops a profile still running (the run ended or stopped at `step`)."""
    self.profile.after_step(step, force=True)

  def measure(self, steps_per_second):
    """(progress line suffix, {scalar name: value}) at this throughput."""
    parts, scalars = [], {}
    if self.flops_per_step and self.peak:
      mfu = self.flops_per_step * steps_per_second / self.peak
      parts.append("MFU %.1f%%" % (100 * mfu))
      scalars.update(mfu=mfu, flops_per_step=self.flops_per_step)
    text, memory = self.memory.measure()
    parts.append(text)
    scalars.update(memory)
    return " | ".join(parts), scalars
