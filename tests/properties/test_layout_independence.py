"""Property: a random program gives the same values and gradients under any legal layout.

Hypothesis draws a small program over named dims (einsums, elementwise unary and binary
ops, reductions, reshapes, transposes) ending in a scalar loss, then a mesh and a random
legal set of layout rules. The program runs on a single-device mesh, on the drawn mesh
(PlacementMeshImpl over virtual CPUs) and as plain TF; the output, the loss and the
gradients with respect to every input must agree.
"""
import math
import string

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, event, given, note, settings, strategies as st

import mesh_tf as mtf

SIZES = (2, 4, 8)
MAX_ELEMENTS = 1024  # no tensor of a program is larger than this
MAX_BOUND = 100.0  # bound on |value| of any tensor, so float32 errors stay small
RTOL, ATOL = 1e-4, 1e-5
MESHES = ("rows:2;cols:4", "rows:4;cols:2", "all:8", "all:4", "all:2", "rows:2;cols:2",
          "x:2;y:2;z:2", "")

# name: (mtf fn, TF fn, bound of |y| given a bound b of |x|, largest b allowed)
UNARY = {
    "tanh": (mtf.tanh, tf.tanh, lambda b: min(b, 1.0), math.inf),
    "sigmoid": (mtf.sigmoid, tf.sigmoid, lambda b: 1.0, math.inf),
    "square": (mtf.square, tf.square, lambda b: b * b, 10.0),
    "exp": (mtf.exp, tf.exp, math.exp, 4.0),
    "relu": (mtf.relu, tf.nn.relu, lambda b: b, math.inf),
    "negative": (mtf.negative, tf.negative, lambda b: b, math.inf),
    "sin": (mtf.sin, tf.sin, lambda b: min(b, 1.0), math.inf),
    "abs": (mtf.abs, tf.abs, lambda b: b, math.inf),
    "softplus": (mtf.softplus, tf.nn.softplus, lambda b: b + 1.0, math.inf),
    "gelu": (mtf.gelu, lambda t: tf.nn.gelu(t, approximate=True), lambda b: b, math.inf),
}

# name: (mtf fn, TF fn, bound of |y| given bounds of |x1| and |x2|)
BINARY = {
    "add": (mtf.add, tf.add, lambda a, b: a + b),
    "sub": (mtf.sub, tf.subtract, lambda a, b: a + b),
    "multiply": (mtf.multiply, tf.multiply, lambda a, b: a * b),
    "maximum": (mtf.maximum, tf.maximum, max),
    "minimum": (mtf.minimum, tf.minimum, max),
}

# name: (mtf fn, TF fn)
REDUCE = {
    "reduce_sum": (mtf.reduce_sum, tf.reduce_sum),
    "reduce_max": (mtf.reduce_max, tf.reduce_max),
    "reduce_min": (mtf.reduce_min, tf.reduce_min),
    "reduce_mean": (mtf.reduce_mean, tf.reduce_mean),
}


# ------------------------------------------------------------------ program description
class Program:
  """A drawn program: dim sizes, input shapes and steps, each making tensor t<i>."""

  def __init__(self, sizes, seed):
    self.sizes = dict(sizes)
    self.seed = seed
    self.num_inputs = 0
    self.steps = []
    self.shapes = []  # dim names of every tensor, inputs first
    self.bounds = []  # bound on |value| of every tensor

  def size(self, names):
    return int(np.prod([self.sizes[n] for n in names], dtype=np.int64))

  def fresh(self, size):
    """Registers a new dim of `size` and returns its name."""
    name = "d%d" % len(self.sizes)
    self.sizes[name] = size
    return name

  def add_input(self, names):
    self.num_inputs += 1
    self.shapes.append(list(names))
    self.bounds.append(1.0)

  def add_step(self, step, names, bound):
    self.steps.append(step)
    self.shapes.append(list(names))
    self.bounds.append(bound)

  def describe(self):
    lines = ["dims: " + " ".join("%s=%d" % kv for kv in self.sizes.items()),
             "seed: %d" % self.seed]
    for i, names in enumerate(self.shapes):
      what = "input" if i < self.num_inputs else _describe_step(
          self.steps[i - self.num_inputs])
      lines.append("t%d[%s] = %s" % (i, ",".join(names), what))
    lines.append("loss = reduce_sum(t%d * W)" % (len(self.shapes) - 1))
    return "\n".join(lines)


def _describe_step(step):
  kind = step[0]
  if kind == "einsum":
    _, a, b, out, k = step
    return "einsum(t%d, t%d -> [%s]) / %d" % (a, b, ",".join(out), k)
  if kind == "unary":
    return "%s(t%d)" % (step[1], step[2])
  if kind == "binary":
    _, fn, a, b, out = step
    extra = "" if out is None else ", output_shape=[%s]" % ",".join(out)
    return "%s(t%d, t%d%s)" % (fn, a, b, extra)
  if kind == "reduce":
    _, fn, a, kept, by_reduced = step
    if by_reduced is not None:
      return "%s(t%d, reduced_dim=[%s])" % (fn, a, ",".join(by_reduced))
    return "%s(t%d, output_shape=[%s])" % (fn, a, ",".join(kept))
  if kind == "merge":
    _, a, first, second, new = step
    return "merge(t%d, %s,%s -> %s)" % (a, first, second, new)
  if kind == "split":
    _, a, old, new1, new2 = step
    return "split(t%d, %s -> %s,%s)" % (a, old, new1, new2)
  if kind == "rename":
    return "rename(t%d, %s -> %s)" % step[1:]
  if kind == "transpose":
    return "transpose(t%d, [%s])" % (step[1], ",".join(step[2]))
  raise ValueError(kind)


def _union(*name_lists):
  out = []
  for names in name_lists:
    out.extend(n for n in names if n not in out)
  return out


def _is_subsequence(short, long):
  it = iter(long)
  return all(any(x == y for y in it) for x in short)


def _broadcast_names(a, b):
  """Output dims of a binary op without output_shape (the library's rule)."""
  for s in (a, b):
    if _is_subsequence(a, s) and _is_subsequence(b, s):
      return list(s)
  return _union(a, b)


# ----------------------------------------------------------------------- step drawers
# Each takes (draw, program, operand) and returns (step, out names, bound) or None when
# it does not apply; the caller then falls back to a unary op.
def _draw_einsum(draw, prog, a):
  b = draw(st.integers(0, len(prog.shapes) - 1))
  union = _union(prog.shapes[a], prog.shapes[b])
  out = draw(st.lists(st.sampled_from(union), unique=True,
                      max_size=len(union))) if union else []
  while prog.size(out) > MAX_ELEMENTS:
    out.pop()
  bound = prog.bounds[a] * prog.bounds[b]
  if bound > MAX_BOUND:
    return None
  k = prog.size(union) // prog.size(out)
  return ("einsum", a, b, out, k), out, bound


def _draw_unary(draw, prog, a):
  bound = prog.bounds[a]
  fn = draw(st.sampled_from(sorted(n for n, row in UNARY.items() if bound <= row[3])))
  new_bound = UNARY[fn][2](bound)
  if new_bound > MAX_BOUND:
    fn, new_bound = "tanh", 1.0
  return ("unary", fn, a), prog.shapes[a], new_bound


def _draw_binary(draw, prog, a):
  b = draw(st.integers(0, len(prog.shapes) - 1))
  fn = draw(st.sampled_from(sorted(BINARY)))
  bound = BINARY[fn][2](prog.bounds[a], prog.bounds[b])
  if bound > MAX_BOUND:
    return None
  union = _union(prog.shapes[a], prog.shapes[b])
  if draw(st.booleans()):
    out = None
    names = _broadcast_names(prog.shapes[a], prog.shapes[b])
  else:
    others = sorted(n for n in prog.sizes if n not in union)
    extra = draw(st.lists(st.sampled_from(others), unique=True, max_size=1)) if others else []
    out = names = draw(st.permutations(union + extra))
  if prog.size(names) > MAX_ELEMENTS:
    return None
  return ("binary", fn, a, b, out), names, bound


def _draw_reduce(draw, prog, a):
  names = prog.shapes[a]
  if not names:
    return None
  fn = draw(st.sampled_from(sorted(REDUCE)))
  kept = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
  bound = prog.bounds[a]
  if fn == "reduce_sum":
    bound *= prog.size(names) // prog.size(kept)
    if bound > MAX_BOUND:
      fn, bound = "reduce_mean", prog.bounds[a]
  by_reduced = None
  if _is_subsequence(kept, names) and draw(st.booleans()):
    by_reduced = [n for n in names if n not in kept]
  return ("reduce", fn, a, kept, by_reduced), kept, bound


def _draw_reshape(draw, prog, a):
  names = prog.shapes[a]
  if not names:
    return None
  kinds = ["rename"] + ["merge"] * (len(names) >= 2)
  splittable = [n for n in names if prog.sizes[n] >= 4]
  kinds += ["split"] * bool(splittable)
  kind = draw(st.sampled_from(kinds))
  if kind == "merge":
    i = draw(st.integers(0, len(names) - 2))
    new = prog.fresh(prog.sizes[names[i]] * prog.sizes[names[i + 1]])
    out = names[:i] + [new] + names[i + 2:]
    return ("merge", a, names[i], names[i + 1], new), out, prog.bounds[a]
  if kind == "split":
    old = draw(st.sampled_from(splittable))
    size = prog.sizes[old]
    first = draw(st.sampled_from([f for f in (2, 4, 8, 16, 32) if size // f >= 2]))
    new1 = prog.fresh(first)
    new2 = prog.fresh(size // first)
    i = names.index(old)
    out = names[:i] + [new1, new2] + names[i + 1:]
    return ("split", a, old, new1, new2), out, prog.bounds[a]
  old = draw(st.sampled_from(names))
  new = prog.fresh(prog.sizes[old])
  out = [new if n == old else n for n in names]
  return ("rename", a, old, new), out, prog.bounds[a]


def _draw_transpose(draw, prog, a):
  names = prog.shapes[a]
  if len(names) < 2:
    return None
  out = draw(st.permutations(names))
  return ("transpose", a, out), out, prog.bounds[a]


DRAWERS = {
    "einsum": _draw_einsum,
    "unary": _draw_unary,
    "binary": _draw_binary,
    "reduce": _draw_reduce,
    "reshape": _draw_reshape,
    "transpose": _draw_transpose,
}


@st.composite
def programs(draw):
  """A Program: 2-6 base dims, 1-3 inputs, then a chain of 2-6 steps."""
  num_dims = draw(st.integers(2, 6))
  sizes = [("d%d" % i, draw(st.sampled_from(SIZES))) for i in range(num_dims)]
  prog = Program(sizes, draw(st.integers(0, 2**31 - 1)))
  base = [n for n, _ in sizes]
  for _ in range(draw(st.integers(1, 3))):
    prog.add_input(draw(st.lists(st.sampled_from(base), min_size=1, max_size=3,
                                 unique=True)))
  for _ in range(draw(st.integers(2, 6))):
    a = len(prog.shapes) - 1  # the chain: each step consumes the latest tensor
    kind = draw(st.sampled_from(sorted(DRAWERS)))
    drawn = DRAWERS[kind](draw, prog, a) or _draw_unary(draw, prog, a)
    prog.add_step(*drawn)
  return prog


def program_values(prog):
  """The input arrays and the loss weights, from the program's seed."""
  rng = np.random.RandomState(prog.seed)
  inputs = [rng.uniform(-1.0, 1.0, [prog.sizes[n] for n in names]).astype(np.float32)
            for names in prog.shapes[:prog.num_inputs]]
  weights = rng.uniform(-1.0, 1.0, [prog.sizes[n] for n in prog.shapes[-1]])
  return inputs, weights.astype(np.float32)


# ------------------------------------------------------------------ building and running
def _mtf_shape(prog, names):
  return mtf.Shape([mtf.Dimension(n, prog.sizes[n]) for n in names])


def _mtf_step(prog, step, ts):
  """Applies one step to mtf tensors ts; returns the new tensor."""
  kind = step[0]
  if kind == "einsum":
    _, a, b, out, k = step
    y = mtf.einsum([ts[a], ts[b]], output_shape=_mtf_shape(prog, out))
    return y * (1.0 / k) if k > 1 else y
  if kind == "unary":
    return UNARY[step[1]][0](ts[step[2]])
  if kind == "binary":
    _, fn, a, b, out = step
    shape = None if out is None else _mtf_shape(prog, out)
    return BINARY[fn][0](ts[a], ts[b], output_shape=shape)
  if kind == "reduce":
    _, fn, a, kept, by_reduced = step
    if by_reduced is not None:
      return REDUCE[fn][0](ts[a], reduced_dim=[
          mtf.Dimension(n, prog.sizes[n]) for n in by_reduced])
    return REDUCE[fn][0](ts[a], output_shape=_mtf_shape(prog, kept))
  if kind == "merge":
    _, a, first, second, new = step
    return mtf.replace_dimensions(
        ts[a], [mtf.Dimension(n, prog.sizes[n]) for n in (first, second)],
        mtf.Dimension(new, prog.sizes[new]))
  if kind == "split":
    _, a, old, new1, new2 = step
    return mtf.replace_dimensions(
        ts[a], mtf.Dimension(old, prog.sizes[old]),
        [mtf.Dimension(n, prog.sizes[n]) for n in (new1, new2)])
  if kind == "rename":
    return mtf.rename_dimension(ts[step[1]], step[2], step[3])
  if kind == "transpose":
    return mtf.transpose(ts[step[1]], _mtf_shape(prog, step[2]))
  raise ValueError(kind)


def build_mtf(prog):
  """The mtf graph of prog: (graph, mesh, [output, loss, grad of each input])."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  inputs, weights = program_values(prog)
  ts = [mtf.import_tf_tensor(mesh, v, _mtf_shape(prog, names), name="t%d" % i)
        for i, (v, names) in enumerate(zip(inputs, prog.shapes))]
  for step in prog.steps:
    y = _mtf_step(prog, step, ts)
    expected = prog.shapes[len(ts)]
    assert y.shape.dimension_names == expected, (
        "t%d has dims %s, expected %s" % (len(ts), y.shape.dimension_names, expected))
    ts.append(y)
  out = ts[-1]
  w = mtf.import_tf_tensor(mesh, weights, out.shape, name="weights")
  loss = mtf.reduce_sum(out * w)
  grads = mtf.gradients([loss], ts[:prog.num_inputs])
  return graph, mesh, [out, loss] + grads


def _tf_broadcast(t, names, out_names):
  """Transposes and expands t (dims `names`) to broadcast against out_names."""
  order = [n for n in out_names if n in names]
  t = tf.transpose(t, [names.index(n) for n in order])
  shape = [t.shape[order.index(n)] if n in order else 1 for n in out_names]
  return tf.reshape(t, shape)


def _tf_step(prog, step, ts, out_names):
  """Applies one step to plain TF tensors ts (dims prog.shapes)."""
  kind = step[0]
  names_of = prog.shapes
  if kind == "einsum":
    _, a, b, out, k = step
    letter = dict(zip(_union(names_of[a], names_of[b]), string.ascii_letters))
    spec = lambda names: "".join(letter[n] for n in names)
    equation = "%s,%s->%s" % (spec(names_of[a]), spec(names_of[b]), spec(out))
    return tf.einsum(equation, ts[a], ts[b]) * (1.0 / k)
  if kind == "unary":
    return UNARY[step[1]][1](ts[step[2]])
  if kind == "binary":
    _, fn, a, b, _ = step
    y = BINARY[fn][1](_tf_broadcast(ts[a], names_of[a], out_names),
                      _tf_broadcast(ts[b], names_of[b], out_names))
    return tf.broadcast_to(y, [prog.sizes[n] for n in out_names])
  if kind == "reduce":
    _, fn, a, kept, _ = step
    names = names_of[a]
    y = REDUCE[fn][1](ts[a], axis=[i for i, n in enumerate(names) if n not in kept])
    rest = [n for n in names if n in kept]
    return tf.transpose(y, [rest.index(n) for n in kept])
  if kind in ("merge", "split", "rename"):
    return tf.reshape(ts[step[1]], [prog.sizes[n] for n in out_names])
  if kind == "transpose":
    names = names_of[step[1]]
    return tf.transpose(ts[step[1]], [names.index(n) for n in step[2]])
  raise ValueError(kind)


def run_reference(prog):
  """Plain-TF values of [output, loss, grad of each input] (None: not connected)."""
  inputs, weights = program_values(prog)
  xs = [tf.constant(v) for v in inputs]
  with tf.GradientTape() as tape:
    for x in xs:
      tape.watch(x)
    ts = list(xs)
    for step in prog.steps:
      ts.append(_tf_step(prog, step, ts, prog.shapes[len(ts)]))
    loss = tf.reduce_sum(ts[-1] * weights)
  grads = tape.gradient(loss, xs)
  return [None if t is None else t.numpy() for t in [ts[-1], loss] + grads]


def run_mtf(graph, mesh, impl, fetches):
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [None if f is None else lowering.export_to_tf_tensor(f).numpy() for f in fetches]


def draw_layout(data, graph, mesh_shape):
  """Random layout rules under which every tensor of graph is legal on mesh_shape.

  Candidate rules are drawn, then kept one by one if every tensor stays legal.
  """
  mesh_dims = [d.name for d in mtf.convert_to_shape(mesh_shape).dims]
  if not mesh_dims:
    return ""
  shapes = {t.shape for op in graph.operations for t in op.outputs}
  names = sorted({d.name for s in shapes for d in s.dims})
  candidates = data.draw(st.lists(
      st.tuples(st.sampled_from(names), st.sampled_from(mesh_dims)), unique=True,
      min_size=1, max_size=2 * len(mesh_dims) + 2), label="candidate rules")
  rules = []
  for pair in candidates:
    impl = mtf.PlacementMeshImpl(mesh_shape, rules + [pair])
    try:
      for s in shapes:
        impl.tensor_layout(s)
    except mtf.LayoutError:
      continue
    rules.append(pair)
  return ";".join("%s:%s" % p for p in rules)


def assert_all_close(actual, expected, what, names):
  """Element-wise closeness of fetched lists; atol scales with the largest |value|."""
  for a, e, name in zip(actual, expected, names):
    assert (a is None) == (e is None), "%s %s: one side has no gradient" % (what, name)
    if a is None:
      continue
    scale = max(1.0, float(np.max(np.abs(e)))) if np.size(e) else 1.0
    np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL * scale,
                               err_msg="%s: %s" % (what, name))


@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          print_blob=True, suppress_health_check=[HealthCheck.too_slow,
                                                  HealthCheck.data_too_large])
@given(prog=programs(), mesh_shape=st.sampled_from(MESHES), data=st.data())
def test_layout_independence(prog, mesh_shape, data):
  """Values and gradients agree on one device, on the drawn layout and in plain TF."""
  note(prog.describe())
  graph, mesh, fetches = build_mtf(prog)
  layout = draw_layout(data, graph, mesh_shape)
  note("mesh %r, layout %r" % (mesh_shape, layout))
  for step in prog.steps:
    event("step %s" % (step[1] if step[0] in ("unary", "binary", "reduce") else step[0]))
  event("mesh %r, %s" % (mesh_shape, "split" if layout else "replicated"))
  size = mtf.convert_to_shape(mesh_shape).size
  devices = ["/cpu:%d" % i for i in range(size)] if mesh_shape else [""]
  names = ["output", "loss"] + ["grad t%d" % i for i in range(prog.num_inputs)]

  single = run_mtf(graph, mesh, mtf.PlacementMeshImpl("", "", [""]), fetches)
  assert_all_close(single, run_reference(prog), "single device vs plain TF", names)
  laid_out = run_mtf(graph, mesh, mtf.PlacementMeshImpl(mesh_shape, layout, devices),
                     fetches)
  assert_all_close(laid_out, single, "mesh %r layout %r vs single device"
                   % (mesh_shape, layout), names)


def test_einsum_with_two_dims_split_on_one_mesh_axis():
  """Regression: dims a and b of different inputs both split over "rows".

  The local einsum used to pair only matching slices of a and b (found by the property
  above as einsum(t2[d1], t1[d0] -> []) under "d0:rows;d1:rows").
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  a, b = mtf.Dimension("a", 2), mtf.Dimension("b", 4)
  rng = np.random.RandomState(0)
  x_np, y_np = rng.randn(2).astype(np.float32), rng.randn(4).astype(np.float32)
  x = mtf.import_tf_tensor(mesh, x_np, mtf.Shape([a]))
  y = mtf.import_tf_tensor(mesh, y_np, mtf.Shape([b]))
  total = mtf.einsum([x, y], output_shape=mtf.Shape([]))
  keep_b = mtf.einsum([x, y], output_shape=mtf.Shape([b]))
  gx, gy = mtf.gradients([total], [x, y])
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "a:rows;b:rows",
                               ["/cpu:%d" % i for i in range(8)])
  got = run_mtf(graph, mesh, impl, [total, keep_b, gx, gy])
  want = [x_np.sum() * y_np.sum(), x_np.sum() * y_np, np.full(2, y_np.sum()),
          np.full(4, x_np.sum())]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
