"""A roofline of issue 16's LM train step at its own shapes: how far each step is from
the time its unavoidable work takes on this host, and where the rest goes.

The step is benchmarks/step_time's (models.tiny_lm: vocab 2048, d_model 256, d_ff 1024,
8 heads x d_kv 32, 2 layers, sequence 128, batch 32, float32, SGD): plain TF on one
device, mesh_tf (placement, SIMD emulation) on one device and on dp / mp / dp+mp over 8
virtual CPUs. For each variant it prints the measured seconds per step, the "floor" and
step/floor. The floor of a layout is the sum of

- matmul: every MatMul / BatchMatMul / Einsum of the traced train step (forward and
  backward), found by walking the step's graph and the bodies of the functions it calls,
  each timed in isolation at its real shape (that op alone, run eagerly on random
  arguments; median of --repeats blocks of --steps calls), summed over all devices.
  The shapes of an 8-device layout are one device's slices, read from the placement
  backend's graph of that layout (one op per device at its slice's shape);
  the same floor applies to the SIMD emulation of the layout, whose graph stacks the
  devices' slices into one op (its own traced FLOPs are printed as a check).
- memory-bound: the bytes the model must touch outside the matmuls if every chain of
  elementwise ops were one fused kernel (each norm, residual add, ReLU, softmax and the
  fused cross-entropy read their inputs and write their outputs once, forward and
  backward; the embedding gather and its scatter-add gradient; the SGD update reading
  each weight and gradient and writing the weight), at each device's slice sizes,
  summed over devices (a replicated tensor is touched once per replica), divided by the
  host's bandwidth measured in the same run (v += x in place over --bandwidth_mb-sized
  float32 arrays; bytes read plus written per second).
- communication: the bytes each processor sends per step by mesh_tf's cost model
  (mesh_tf.analysis.estimate_cost, as benchmarks/layouts.py reads them) times the
  number of devices, each byte read once and written once, at the same bandwidth.

Assumption for the 8-device layouts: the 8 virtual CPUs share this host's cores, so
they do not add compute; the floor is the sum over devices of each device's work, run
one op after another with all the host's cores on each op (as each op was timed).

The host is shared with other work, so wall seconds move with its load (and a step
running ops on 8 devices at once can take a larger share of a contended CPU than one
op at a time). Each step, isolated matmul and the bandwidth probe is therefore also
measured in this process's CPU seconds per call ("CPU s/step", "CPU floor s": the same
sums with CPU seconds, the bandwidth per CPU-second); all are timed in the same
alternating rounds.

The profile ("op-s by family") is from a TF profiler trace (tf.profiler.experimental) of
--profile_steps steps of each variant: the summed durations of the executor's op events,
per step, by op family (matmul, elementwise, reductions, copies/collectives, other).
Ops overlap on the host's threads, so the sum can exceed the step's wall time; it says
which family the time goes to, next to that family's floor.

  python -m benchmarks.roofline [--size=tiny --steps 3 --repeats 3
                                 --backends placement,simd]
(--steps, --repeats and --backends are benchmarks.step_time's flags.)
"""
import collections
import glob
import os
import re
import shutil
import statistics
import tempfile
import time

from absl import app
from absl import flags

from benchmarks import common
from benchmarks import step_time
from models.transformer.trainer import step_metrics

FLAGS = flags.FLAGS
# --steps (train steps, or isolated-op calls, per timed block), --repeats (timed blocks;
# here the median is reported) and --backends (mesh_tf backends to time) are
# step_time's flags, defined when it is imported.
common.define_flag(flags.DEFINE_string, "size", "full",
                   "Model size: full (step_time's LM) or tiny (smoke).")
common.define_flag(flags.DEFINE_integer, "profile_steps", 2,
                   "Steps traced by the profiler (0: no profile).")
common.define_flag(flags.DEFINE_integer, "bandwidth_mb", 64,
                   "Size of each operand of the bandwidth probe.")

SIZES = {
    "tiny": dict(common.LM_SIZES["tiny"], learning_rate=0.05),
    "full": dict(batch=32, length=128, vocab=2048, d_model=256, heads=8, d_kv=32,
                 d_ff=1024, num_layers=2, learning_rate=0.05),
}
LAYOUTS = step_time.LAYOUTS
FAMILIES = ("matmul", "elementwise", "reductions", "copies/collectives", "other")

# ---------------------------------------------------------------------------------------
# The matmul inventory of a traced step.

MATMUL_TYPES = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum")
_MATMUL_ATTRS = ("equation", "transpose_a", "transpose_b", "adj_x", "adj_y")
_FUNCTION_ATTRS = ("f", "then_branch", "else_branch", "body", "cond")

Matmul = collections.namedtuple("Matmul", ["op_type", "attrs", "shapes", "dtype",
                                           "device"])
Matmul.__doc__ = """One matmul op run by a step: its type, attrs ((name, value), ...),
input shapes, dtype name and the device it runs on ('' when unplaced)."""


def _attr_value(v):
  return v.decode() if isinstance(v, bytes) else v


def matmul_inventory(graph, live_only=True):
  """Every matmul op a run of `graph` (a FuncGraph) executes, one Matmul per execution.

  Walks the graph and, for each function-calling op (call, If, While), the called
  function's body with the caller's input shapes and device: a body called on 8
  devices contributes its matmuls 8 times. (A While body is counted once.) With
  live_only, ops no output or control output depends on (pruned by TF) are left out.
  """
  from tensorflow.python.framework import function_def_to_graph  # pylint: disable=g-import-not-at-top
  library = {f.signature.name: f for f in graph.as_graph_def().library.function}
  bodies = {}  # (function name, input shapes) -> its graph
  out = []

  def walk(g, device):
    live = set(step_metrics.live_operations(g)) if live_only else None
    for op in g.get_operations():
      if live is not None and op not in live:
        continue
      dev = op.device or device
      if op.type in MATMUL_TYPES:
        attrs = tuple((k, _attr_value(op.get_attr(k))) for k in _MATMUL_ATTRS
                      if k in op.node_def.attr)
        shapes = tuple(tuple(x.shape.as_list()) if x.shape.rank is not None else None
                       for x in op.inputs)
        out.append(Matmul(op.type, attrs, shapes, op.inputs[0].dtype.name, dev))
      for a in _FUNCTION_ATTRS:
        if a not in op.node_def.attr or not op.node_def.attr[a].func.name:
          continue
        fdef = library.get(op.node_def.attr[a].func.name)
        if fdef is None:
          continue
        inputs = list(op.inputs)
        if op.type in ("If", "StatelessIf"):
          inputs = inputs[1:]
        key = (fdef.signature.name, tuple(tuple(x.shape.as_list()) if x.shape.rank
                                          is not None else None for x in inputs))
        if key not in bodies:
          bodies[key] = function_def_to_graph.function_def_to_graph(
              fdef, input_shapes=[x.shape for x in inputs])
        walk(bodies[key], dev)
  walk(graph, "")
  return out


def step_graph(step, args):
  """The FuncGraph of step traced on args."""
  return step.get_concrete_function(*args).graph


def _einsum_sizes(equation, shapes):
  lhs = equation.split("->")[0].split(",")
  if "." in equation:
    raise ValueError("ellipsis einsum not supported: %s" % equation)
  sizes = {}
  for letters, shape in zip(lhs, shapes):
    for ch, n in zip(letters, shape):
      sizes[ch] = max(sizes.get(ch, 1), n)
  return sizes


def matmul_flops(m):
  """Multiply-add FLOPs (2 per multiply-add) of one Matmul."""
  attrs = dict(m.attrs)
  a, b = m.shapes
  if a is None or b is None or None in a or None in b:
    raise ValueError("unknown shape in %s" % (m,))
  if m.op_type == "Einsum":
    prod = 1
    for n in _einsum_sizes(attrs["equation"], m.shapes).values():
      prod *= n
    return 2.0 * prod
  ta = attrs.get("transpose_a", attrs.get("adj_x", False))
  tb = attrs.get("transpose_b", attrs.get("adj_y", False))
  rows, inner = (a[-1], a[-2]) if ta else (a[-2], a[-1])
  cols = b[-2] if tb else b[-1]
  batch = 1
  pad = max(len(a), len(b)) - 2
  ba = [1] * (pad - (len(a) - 2)) + list(a[:-2])
  bb = [1] * (pad - (len(b) - 2)) + list(b[:-2])
  for x, y in zip(ba, bb):
    batch *= max(x, y)
  return 2.0 * batch * rows * inner * cols


def total_matmul_flops(inventory):
  return sum(matmul_flops(m) for m in inventory)


def by_device(inventory):
  """{device: [Matmul]} (placement puts one copy of each op on each device)."""
  out = collections.defaultdict(list)
  for m in inventory:
    out[m.device].append(m)
  return dict(out)


def analytic_matmul_flops(c):
  """The LM step's matmul FLOPs: 6 x tokens x matmul weights (forward 2, backward 4;
  the embedding is a gather) plus attention's two einsums, 3 x 2 x 2 x B H L^2 K each."""
  tokens = c.batch * c.length
  weights = c.num_layers * (4 * c.d_model * c.heads * c.d_kv + 2 * c.d_model * c.d_ff)
  weights += c.d_model * c.vocab
  attention = c.num_layers * 12 * c.batch * c.heads * c.length * c.length * c.d_kv
  return 6.0 * tokens * weights + attention


# ---------------------------------------------------------------------------------------
# Isolated timing.

def _key(m):
  return (m.op_type, m.attrs, m.shapes, m.dtype)


def _isolated_fn(key):
  """A zero-argument callable running one matmul at its shape, eagerly (no graph to
  build or optimize; one op's dispatch, tens of microseconds, against the op's
  milliseconds at the full size), on random arguments made once."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  op_type, attrs, shapes, dtype = key
  attrs = dict(attrs)
  a, b = [tf.random.normal(s, dtype=dtype) for s in shapes]
  if op_type == "Einsum":
    return lambda: tf.raw_ops.Einsum(inputs=[a, b], equation=attrs["equation"])
  if op_type == "MatMul":
    return lambda: tf.raw_ops.MatMul(a=a, b=b,
                                     transpose_a=attrs.get("transpose_a", False),
                                     transpose_b=attrs.get("transpose_b", False))
  if op_type == "BatchMatMulV3":
    return lambda: tf.raw_ops.BatchMatMulV3(x=a, y=b, Tout=a.dtype,
                                            adj_x=attrs.get("adj_x", False),
                                            adj_y=attrs.get("adj_y", False))
  return lambda: tf.raw_ops.BatchMatMulV2(x=a, y=b, adj_x=attrs.get("adj_x", False),
                                          adj_y=attrs.get("adj_y", False))


class _CpuMeter(object):
  """Wraps a zero-argument callable; records this process's CPU seconds per call (the
  calls run synchronously) after the first (the warm-up)."""

  def __init__(self, fn):
    self._fn, self._samples, self._calls = fn, [], 0

  def __call__(self):
    start = time.process_time()
    out = self._fn()
    if hasattr(out, "numpy"):
      out.numpy()
    if self._calls:
      self._samples.append(time.process_time() - start)
    self._calls += 1
    return out

  def median(self):
    return statistics.median(self._samples)


def bandwidth_probe(megabytes):
  """(fn, bytes): fn runs v += x in place over float32 arrays of `megabytes` (a
  variable's buffer: a fused kernel writing into a buffer it reuses; an allocating
  x + y of this size also pays the page faults of its fresh output, 2-4x slower on
  this host), touching `bytes` (read plus written)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  n = int(megabytes * 2**20 // 4)
  x = tf.random.normal([n])
  v = tf.Variable(tf.zeros([n]))

  @tf.function(autograph=False)
  def add():
    v.assign_add(x)
    return tf.constant(0.0)
  return add, 3.0 * 4 * n


# ---------------------------------------------------------------------------------------
# Memory-bound work and communication.

def memory_items(c):
  """[(family, what, multiplicity, [dim names])]: the tensors the step must read or
  write outside its matmuls, if each elementwise chain were one fused kernel."""
  x = ["batch", "length", "d_model"]
  ff = ["batch", "length", "d_ff"]
  att = ["batch", "heads", "length", "memory_length"]
  logits = ["batch", "length", "vocab"]
  items = []
  for i in range(c.num_layers):
    p = "layer %d " % i
    items += [
        ("elementwise", p + "rms norms fwd (read x, write h)", 2 * 2, x),
        ("reductions", p + "masked softmax fwd (read, write)", 2, att),
        ("elementwise", p + "residual adds fwd (read 2, write 1)", 2 * 3, x),
        ("elementwise", p + "relu fwd (read, write)", 2, ff),
        ("elementwise", p + "relu grad (read dy, y; write dx)", 3, ff),
        ("reductions", p + "softmax grad (read p, dp; write dlogits)", 3, att),
        ("elementwise", p + "rms norm grads (read x, dh, dres; write dx)", 2 * 4, x),
    ]
  items += [
      ("other", "embedding gather (read rows, write x)", 2, x),
      ("elementwise", "final norm fwd + grad", 2 + 3, x),
      ("reductions", "fused cross-entropy fwd + grad (read logits, write dlogits)", 2,
       logits),
      ("other", "embedding grad scatter-add (read dx)", 1, x),
      ("other", "embedding grad (write)", 1, ["vocab", "d_model"]),
  ]
  from models.tiny_lm import config  # pylint: disable=g-import-not-at-top
  for name, dims in config.weight_shapes(c).items():
    items.append(("elementwise", "SGD %s (read w, g; write w)" % name, 3,
                  [d for d, _ in dims]))
  return items


def memory_bytes_by_family(c, mesh_shape, layout_rules):
  """{family: bytes touched per step, summed over the devices, at slice sizes}."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tf.shapes.mesh_layout import MeshLayout  # pylint: disable=g-import-not-at-top
  layout = MeshLayout(mesh_shape, layout_rules)
  sizes = dict(batch=c.batch, length=c.length, memory_length=c.length,
               d_model=c.d_model, heads=c.heads, d_kv=c.d_kv, d_ff=c.d_ff, vocab=c.vocab)
  n = max(layout.size, 1)
  out = collections.Counter()
  for family, _, mult, dims in memory_items(c):
    shape = mtf.Shape([mtf.Dimension(d, sizes[d]) for d in dims])
    out[family] += 4 * mult * layout.slice_size(shape) * n
  return out


def comm_bytes(model, mesh_shape, layout_rules):
  """Bytes sent per step, all processors together, by mesh_tf's cost model."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tf import analysis  # pylint: disable=g-import-not-at-top
  cost = analysis.estimate_cost(model.graph, mesh_shape, layout_rules,
                                fetches=[model.loss] + model.update_ops)
  return cost.comm_bytes_per_processor * max(mtf.convert_to_shape(mesh_shape).size, 1)


# ---------------------------------------------------------------------------------------
# Profile by op family.

_FAMILY_OF = {}
for _t in MATMUL_TYPES:
  _FAMILY_OF[_t] = "matmul"
for _t in ("Add", "AddV2", "AddN", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Neg",
           "Rsqrt", "RsqrtGrad", "Sqrt", "Square", "SquaredDifference", "Relu",
           "ReluGrad", "Exp", "Log", "Cast", "Select", "SelectV2", "Less", "LessEqual",
           "Greater", "GreaterEqual", "Equal", "NotEqual", "LogicalAnd", "LogicalOr",
           "Maximum", "Minimum", "Pow", "Reciprocal", "Tanh", "Sigmoid", "BiasAdd",
           "AssignSubVariableOp", "AssignAddVariableOp", "AssignVariableOp", "OnesLike",
           "ZerosLike", "Fill", "_FusedMulAdd", "_FusedMulSub", "_FusedAddN",
           "ResourceApplyGradientDescent"):
  _FAMILY_OF[_t] = "elementwise"
for _t in ("Sum", "Mean", "Max", "Min", "Prod", "Softmax", "LogSoftmax",
           "SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits",
           "ArgMax", "ArgMin", "All", "Any"):
  _FAMILY_OF[_t] = "reductions"
for _t in ("_Send", "_Recv", "_HostSend", "_HostRecv", "Identity", "IdentityN",
           "ConcatV2", "Concat", "Split", "SplitV", "Slice", "StridedSlice", "Pack",
           "Unpack", "Transpose", "Reshape", "ExpandDims", "Squeeze", "Tile",
           "BroadcastTo", "Copy", "CollectiveReduceV2", "CollectiveGatherV2",
           "CollectiveAllToAllV2", "CollectiveReduce", "CollectiveGather",
           "CollectiveBcastSend", "CollectiveBcastRecv", "Roll", "Pad", "PadV2"):
  _FAMILY_OF[_t] = "copies/collectives"
_CALL_TYPES = ("PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf",
               "While", "StatelessWhile")
_OP_EVENT = re.compile(r"^[^:\s]+:([A-Za-z_][A-Za-z0-9_]*)$")


def family_of(op_type):
  return _FAMILY_OF.get(op_type, "other")


def profile_families(fn, steps):
  """{family: op-seconds per step} from a profiler trace of `steps` calls of fn; None
  (and the reason) if the trace cannot be taken or read."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  logdir = tempfile.mkdtemp(prefix="roofline_profile_")
  try:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
    fn().numpy()
    tf.profiler.experimental.start(logdir)
    try:
      for _ in range(steps):
        out = fn()
      out.numpy()
    finally:
      tf.profiler.experimental.stop()
    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
      return None, "no trace written"
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as f:
      space.ParseFromString(f.read())
    ps = collections.Counter()
    for plane in space.planes:
      for line in plane.lines:
        for e in line.events:
          match = _OP_EVENT.match(plane.event_metadata[e.metadata_id].name)
          if match and match.group(1) not in _CALL_TYPES:
            ps[family_of(match.group(1))] += e.duration_ps
    if not ps:
      return None, "no op events in the trace"
    return {k: ps[k] * 1e-12 / steps for k in FAMILIES}, None
  except Exception as e:  # pylint: disable=broad-except
    return None, "%s: %s" % (type(e).__name__, e)
  finally:
    shutil.rmtree(logdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------

def run(size="full", steps=3, repeats=3, backends=("placement", "simd"), profile_steps=2,
        bandwidth_mb=64):
  """Builds, times and prints everything (see the module docstring); returns a dict per
  variant: variant, layout, step and floor (seconds), traced_flops and inventory (the
  matmuls of its traced step)."""
  devices = common.set_up_virtual_cpus(8)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig(**SIZES[size])
  weights = config.initial_weights(c)
  batch = config.synthetic_batch(c)
  args = [tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])]

  variants = collections.OrderedDict()  # label -> (layout label, step)
  variants["plain TF single"] = ("single", step_time.make_tf_step(c, weights))
  layout_info = {}  # layout label -> (model, mesh_shape, rules, placement inventory)
  for backend in ["placement"] + [b for b in backends if b != "placement"]:
    for label, mesh_shape, rules in LAYOUTS:
      model = mtf_model.TinyLmModel(c, weights)
      n = mtf.convert_to_shape(mesh_shape).size
      impl = mtf.make_mesh_impl(backend, mesh_shape, rules, devices[:max(n, 1)])
      step = model.make_train_step(impl, jit_compile=impl.needs_xla)
      if backend == "placement":
        layout_info[label] = (model, mesh_shape, rules,
                              matmul_inventory(step_graph(step, args)))
      if backend in backends:
        variants["mesh_tf %s %s" % (backend, label)] = (label, step)
  inventories = {k: (layout_info[label][3] if k.startswith("mesh_tf placement ") else
                     matmul_inventory(step_graph(s, args)))
                 for k, (label, s) in variants.items()}

  # Steps, isolated matmuls and the bandwidth probe are timed in the same alternating
  # rounds, so a change in the host's load moves all of them alike.
  fns = {k: (lambda s=s: s(*args)) for k, (_, s) in variants.items()}
  probe, probe_bytes = bandwidth_probe(bandwidth_mb)
  keys = []
  for info in layout_info.values():
    keys += [_key(m) for m in info[3] if _key(m) not in keys]
  timed = dict(fns)
  timed.update({("matmul",) + k: _isolated_fn(k) for k in keys})
  timed[("bandwidth",)] = probe
  meters = {k: _CpuMeter(fn) for k, fn in timed.items()}
  times = common.time_alternating(meters, steps, repeats)
  cpu = {k: m.median() for k, m in meters.items()}
  op_time = {k: times[("matmul",) + k] for k in keys}
  op_cpu = {k: cpu[("matmul",) + k] for k in keys}
  bandwidth = probe_bytes / times[("bandwidth",)]
  cpu_bandwidth = probe_bytes / cpu[("bandwidth",)]

  floors = {}
  for label, (model, mesh_shape, rules, inv) in layout_info.items():
    mem = memory_bytes_by_family(c, mesh_shape, rules)
    comm = comm_bytes(model, mesh_shape, rules)
    floors[label] = dict(
        matmul=sum(op_time[_key(m)] for m in inv),
        elementwise=mem["elementwise"] / bandwidth,
        reductions=mem["reductions"] / bandwidth,
        other=mem["other"] / bandwidth,
        comm=2.0 * comm / bandwidth,
        comm_bytes=comm, mem_bytes=sum(mem.values()),
        per_device_flops=total_matmul_flops(inv) / len(by_device(inv)),
        devices=len(by_device(inv)))
    floors[label]["total"] = sum(floors[label][k] for k in (
        "matmul", "elementwise", "reductions", "other", "comm"))
    floors[label]["cpu"] = (sum(op_cpu[_key(m)] for m in inv) +
                            (sum(mem.values()) + 2.0 * comm) / cpu_bandwidth)

  print(common.machine_line())
  print("LM %s; 8 virtual CPUs; median of %d blocks of %d steps" % (
      dict(c._asdict()), repeats, steps))
  print("bandwidth (v += x in place, %d MB arrays, read + written): %.1f GB/s, %.1f GB "
        "per CPU-second" % (bandwidth_mb, bandwidth / 1e9, cpu_bandwidth / 1e9))
  print("analytic matmul FLOPs per step: %.3f GFLOP" % (analytic_matmul_flops(c) / 1e9))
  print()
  print("Matmuls of the single-device step (mesh_tf placement's graph; plain TF's has the"
        " same shapes), each timed alone:")
  single = collections.Counter(_key(m) for m in layout_info["single"][3])
  rows = [["op", "equation / adj", "input shapes", "count", "GFLOP each", "ms each",
           "GFLOP/s", "CPU ms each"]]
  for k, count in single.items():
    flops = matmul_flops(Matmul(*k, device=""))
    attrs = ",".join(str(v) for _, v in k[1])
    rows.append([k[0], attrs, " x ".join("x".join(map(str, s)) for s in k[2]),
                 str(count), "%.3f" % (flops / 1e9), "%.2f" % (1e3 * op_time[k]),
                 "%.1f" % (flops / op_time[k] / 1e9), "%.2f" % (1e3 * op_cpu[k])])
  common.print_table(rows)
  print()
  print("Floor = matmuls timed alone + fused memory-bound bytes / bandwidth + 2 x bytes"
        " sent (cost model) / bandwidth; 8-device layouts: summed over the devices, which"
        " share this host's cores")
  rows = [["variant", "s/step", "floor s", "step/floor", "matmul s", "memory s",
           "comm s", "CPU s/step", "CPU floor s", "CPU step/floor", "devices",
           "GFLOP/device", "traced GFLOP", "mem MB", "comm MB"]]
  results = []
  for k, (label, _) in variants.items():
    f = floors[label]
    mem_s = f["elementwise"] + f["reductions"] + f["other"]
    traced = total_matmul_flops(inventories[k])
    rows.append([k, "%.3f" % times[k], "%.3f" % f["total"],
                 "%.2f" % (times[k] / f["total"]), "%.3f" % f["matmul"], "%.3f" % mem_s,
                 "%.4f" % f["comm"], "%.3f" % cpu[k], "%.3f" % f["cpu"],
                 "%.2f" % (cpu[k] / f["cpu"]), str(f["devices"]),
                 "%.3f" % (f["per_device_flops"] / 1e9), "%.3f" % (traced / 1e9),
                 "%.1f" % (f["mem_bytes"] / 1e6), "%.2f" % (f["comm_bytes"] / 1e6)])
    results.append(dict(variant=k, layout=label, step=times[k], floor=f["total"],
                        cpu=cpu[k], cpu_floor=f["cpu"], traced_flops=traced,
                        inventory=inventories[k]))
  common.print_table(rows)

  if profile_steps > 0:
    print()
    print("Profile (%d traced steps): op-seconds per step by family (summed op event "
          "durations; ops overlap, so a row can exceed the step) / that family's floor"
          % profile_steps)
    rows = [["variant", "s/step"] + ["%s (floor)" % fam for fam in FAMILIES] +
            ["sum op-s"]]
    for k, (label, _) in variants.items():
      prof, why = profile_families(fns[k], profile_steps)
      if prof is None:
        print("%s: profile unavailable (%s)" % (k, why))
        continue
      f = floors[label]
      floor_of = dict(matmul=f["matmul"], elementwise=f["elementwise"],
                      reductions=f["reductions"], other=f["other"])
      floor_of["copies/collectives"] = f["comm"]
      rows.append([k, "%.3f" % times[k]] + [
          "%.3f (%.3f)" % (prof[fam], floor_of[fam]) for fam in FAMILIES] + [
              "%.3f" % sum(prof.values())])
    if len(rows) > 1:
      common.print_table(rows)
  return results


def main(_):
  run(FLAGS.size, FLAGS.steps, FLAGS.repeats, FLAGS.backends, FLAGS.profile_steps,
      FLAGS.bandwidth_mb)


if __name__ == "__main__":
  app.run(main)
