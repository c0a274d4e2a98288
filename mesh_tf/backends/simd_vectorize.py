"""Runs a function written for one core's slices on every emulated core at once.

The emulation keeps each laid-out tensor compact, [*extents, *slice] (extent 1 along
the mesh axes where every core holds the same slice; see `simd_emulation`), so an op's
slice function is vectorized over the mesh axes:

1. `fn` is traced once on slice-shaped placeholders in a scratch graph; within one graph,
   a later call with the same `slice_fn_key.call_key` reuses that trace unless it has
   stateful ops (a random op needs a new seed per call).
2. If every op of the trace has a rule below, the ops are replayed on the compact tensors:
   ops that read no slice run once for all cores; the others get their axis arguments
   shifted past the mesh axes, and numpy broadcasting pairs extents of 1 with full ones.
   The replay emits as many TF ops as one slice needs, whatever the core count.
3. Otherwise `tf.vectorized_map` runs `fn` on every core (inputs broadcast to the mesh).

Steps 1-2 are part of the speed layer (`mesh_tf.lowering.speed_layer`); with it off every
call takes step 3. `stats` counts the path each call took ("plain": the layer was off).
"""
import collections
import functools
import inspect

import numpy as np
import tensorflow as tf

from mesh_tf.backends import simd_matmul
from mesh_tf.backends import slice_fn_key
from mesh_tf.lowering import direct_ops, local_einsum, speed_layer

stats = collections.Counter()

# Elementwise ops (numpy broadcasting): stacked inputs are aligned on per-slice rank.
_CWISE = frozenset("""
Abs Acos Acosh Add AddN AddV2 Asin Asinh Atan Atan2 Atanh BitwiseAnd BitwiseOr
BitwiseXor Cast Ceil Cos Cosh DivNoNan Elu EluGrad Equal Erf Erfc Exp Expm1
Floor FloorDiv FloorMod Gelu GeluGrad Greater GreaterEqual Identity Inv InvGrad IsFinite
IsInf IsNan LeakyRelu LeakyReluGrad LeftShift Less LessEqual Lgamma Log Log1p LogicalAnd
LogicalNot LogicalOr Maximum Minimum Mod Mul MulNoNan Neg NotEqual OnesLike Pow RealDiv
Reciprocal ReciprocalGrad Relu Relu6 Relu6Grad ReluGrad RightShift Rint Round Rsqrt
RsqrtGrad SelectV2 Selu SeluGrad Sigmoid SigmoidGrad Sign Sin Sinh Softplus
SoftplusGrad Softsign Sqrt SqrtGrad Square SquaredDifference Sub Tan Tanh TanhGrad
TruncateDiv TruncateMod Xdivy Xlog1py Xlogy ZerosLike StopGradient PreventGradient
""".split())
# Elementwise ops that need equal shapes, not broadcasting: their stacked inputs are
# expanded to the union of the inputs' extents.
_SAME_SHAPE = frozenset("""
AddN EluGrad GeluGrad InvGrad LeakyReluGrad ReciprocalGrad Relu6Grad ReluGrad RsqrtGrad
SeluGrad SigmoidGrad SoftplusGrad SqrtGrad TanhGrad
""".split())
# Ops whose axis is one input (by op_def input name): non-negative axes move up by one.
_AXIS_INPUT = {
    "Sum": "reduction_indices", "Max": "reduction_indices", "Min": "reduction_indices",
    "Prod": "reduction_indices", "Mean": "reduction_indices", "All": "reduction_indices",
    "Any": "reduction_indices", "ArgMax": "dimension", "ArgMin": "dimension",
    "ConcatV2": "axis", "ExpandDims": "dim", "Cumsum": "axis", "Cumprod": "axis",
    "Roll": "axis", "Split": "split_dim", "SplitV": "split_dim", "Reverse": None,
    "ReverseV2": "axis",
}
# Ops whose axis is an attr.
_AXIS_ATTR = {"Pack": "axis", "Unpack": "axis", "OneHot": "axis"}
# Other inputs of axis ops that must be the same on every core.
_EXTRA_CONTROLS = {"Roll": {"shift"}, "SplitV": {"size_splits"},
                   "OneHot": {"depth", "on_value", "off_value"}}
_SHAPE_OPS = frozenset(["Shape", "Size", "Rank"])
# Sums (and the identity): their sum recipe is the sum of their inputs' (`_sum_recipe`).
_SUMS = frozenset(["AddN", "AddV2", "Add", "Identity"])


class _Fallback(Exception):
  """The trace used an op the replay has no rule for."""


def _input_groups(op):
  """Splits op.inputs by op_def input arg: [(arg name, [tensors], is_list)]."""
  groups, i = [], 0
  for arg in op.op_def.input_arg:
    if arg.number_attr:
      n, is_list = op.get_attr(arg.number_attr), True
    elif arg.type_list_attr:
      n, is_list = len(op.get_attr(arg.type_list_attr)), True
    else:
      n, is_list = 1, False
    groups.append((arg.name, list(op.inputs[i:i + n]), is_list))
    i += n
  return groups


def _explicit_attrs(op):
  """The attrs a tf.raw_ops call takes (those not inferred from the inputs)."""
  inferred = set()
  for arg in op.op_def.input_arg:
    inferred.update(a for a in (arg.type_attr, arg.number_attr, arg.type_list_attr) if a)
  return {a.name: op.get_attr(a.name) for a in op.op_def.attr if a.name not in inferred}


_PARAMS = {}


def _python_names(op):
  """(tf.raw_ops.<type>, {op_def input/attr name: its keyword}) (ExpandDims' "dim" is
  "axis"): inputs map in order, attrs by name where it matches, else in order."""
  if op.type not in _PARAMS:
    raw = getattr(tf.raw_ops, op.type, None)
    if raw is None:
      raise _Fallback(op.type)
    params = [p for p in inspect.signature(raw).parameters if p != "name"]
    inputs = [a.name for a in op.op_def.input_arg]
    names = dict(zip(inputs, params))
    rest = params[len(inputs):]
    attrs = list(_explicit_attrs(op))
    unmatched = [p for p in rest if p not in attrs]
    for a in attrs:
      names[a] = a if a in rest else unmatched.pop(0)
    _PARAMS[op.type] = (raw, names)
  return _PARAMS[op.type]


def _is_splat_view(value):
  """Whether value is a numpy array of rank >= 1 broadcast from one element (a lazy Fill)."""
  return (isinstance(value, np.ndarray) and value.ndim > 0 and value.size > 0 and
          not any(value.strides))


def _as_tensor(value):
  if _is_splat_view(value):  # a Fill again, not a constant of every element
    return tf.fill(value.shape, direct_ops.constant(np.asarray(value.flat[0])))
  return direct_ops.constant(value) if isinstance(value, np.ndarray) else value


def _splat_scalar(value):
  """The one element (0-d) of a numpy array of rank >= 1 with all elements equal, or None."""
  if not isinstance(value, np.ndarray) or value.ndim == 0 or value.dtype.kind not in "biuf":
    return None
  first = value.flat[0] if value.size else None
  if first is None or not (_is_splat_view(value) or (value == first).all()):
    return None
  return np.asarray(first, value.dtype)


def _call_raw(op, args, attrs):
  """Emits op.type on inputs and attrs keyed by op_def names; its outputs, a flat list."""
  if any(_is_splat_view(x) for v in args.values() for x in (v if isinstance(v, list)
                                                              else [v])):
    args = {k: [_as_tensor(x) for x in v] if isinstance(v, list) else _as_tensor(v)
            for k, v in args.items()}
  made = direct_ops.like(op, args, attrs)
  if made is not None:
    return made
  raw, names = _python_names(op)
  # a numpy input becomes a constant of its own dtype, not of the raw op's default type
  args = {k: [_as_tensor(x) for x in v] if isinstance(v, list) else _as_tensor(v)
          for k, v in args.items()}
  kwargs = {names[k]: v for k, v in list(args.items()) + list(attrs.items())}
  result = raw(**kwargs)
  if isinstance(result, (tf.Tensor, tf.Variable)) or hasattr(result, "dtype"):
    return [result]
  return [x for r in result for x in (r if isinstance(r, (list, tuple)) else [r])]


def _shift_axis(a, k):
  """Non-negative axis values moved past the k mesh axes (in numpy where known)."""
  static = tf.get_static_value(a)
  if static is not None:
    static = np.asarray(static)
    return np.where(static >= 0, static + k, static).astype(static.dtype)
  a = tf.convert_to_tensor(a)
  return tf.where(a >= 0, a + k, a)


def union_extents(extents_list):
  """Per mesh axis, the largest extent (1 = same on every core along that axis)."""
  return [max(e) for e in zip(*extents_list)]


def broadcast_extents(value, extents, target):
  """A compact value with mesh extents `extents` broadcast to `target` extents."""
  if list(extents) == list(target):
    return value
  shape = tf.concat([tf.constant(target, tf.int32), tf.shape(value)[len(target):]], 0)
  return tf.broadcast_to(value, shape)


class _Replay:
  """Replays a scratch trace on compact values: {scratch tensor ref: (value, extents)};
  extents None: the same on every core, without mesh axes."""

  def __init__(self, mesh_shape):
    self.mesh_shape = list(mesh_shape)
    self.k = len(self.mesh_shape)
    self.values = {}
    # scratch tensor ref -> recipe(drop_axes): its value summed over those mesh axes
    self.einsum_recipes = {}

  def get(self, t):
    return self.values[t.ref()]

  def extents(self, t):
    return self.get(t)[1]

  def as_stacked(self, t, target=None):
    """t's value with mesh axes (of size 1 if it has none), broadcast to target if given."""
    v, extents = self.get(t)
    if extents is None:
      if _is_splat_view(v):
        v = _as_tensor(np.broadcast_to(v.flat[0], [1] * self.k + list(v.shape)))
      elif isinstance(v, np.ndarray):
        v = np.reshape(v, [1] * self.k + list(v.shape))
      elif v.shape.is_fully_defined():
        v = direct_ops.reshape(v, [1] * self.k + v.shape.as_list())
      else:
        v = tf.reshape(v, tf.concat([tf.ones([self.k], tf.int32), tf.shape(v)], 0))
      extents = [1] * self.k
    return v if target is None else broadcast_extents(v, extents, target)

  def aligned(self, t, rank):
    """t's stacked value with size-1 dims after the mesh axes up to per-slice `rank`."""
    v, extents = self.get(t)
    if extents is None:
      return v
    r = t.shape.rank
    if r == rank:
      return v
    if v.shape.is_fully_defined():  # one reshape for all the new axes
      shape = v.shape.as_list()
      return direct_ops.reshape(v, shape[:self.k] + [1] * (rank - r) + shape[self.k:])
    for _ in range(rank - r):
      v = tf.expand_dims(v, self.k)
    return v

  def run(self, op):
    groups = _input_groups(op)
    in_extents = [self.extents(t) for _, ts, _ in groups for t in ts]
    in_extents = [e for e in in_extents if e is not None]
    attrs = _explicit_attrs(op)
    if op.type == "Const":
      # kept in numpy: an op that reads it emits it (or folds it, e.g. a shifted axis)
      outs, extents = [tf.make_ndarray(op.get_attr("value"))], None
    elif op.type == "Fill" and not in_extents and all(
        isinstance(self.get(t)[0], np.ndarray) for t in op.inputs):
      # Kept in numpy too, as a broadcast view: TF writes a small tf.fill as a Const and a
      # large one as a Fill, and the slice size must not change which ops are emitted.
      dims, value = (self.get(t)[0] for t in op.inputs)
      outs, extents = [np.broadcast_to(np.asarray(value), np.asarray(dims).tolist())], None
    elif op.type in _SHAPE_OPS and in_extents:
      outs, extents = self._static_shape_op(op), None
    elif not in_extents:
      if op.op_def.is_stateful and op.type not in ("ReadVariableOp",):
        raise _Fallback(op.type)
      args = {name: [self.get(t)[0] for t in ts] if is_list else self.get(ts[0])[0]
              for name, ts, is_list in groups}
      outs, extents = _call_raw(op, args, attrs), None
    else:
      extents = union_extents(in_extents)
      outs = self._stacked_op(op, groups, attrs, extents)
    if len(outs) != len(op.outputs):
      raise _Fallback(op.type)
    for t, v in zip(op.outputs, outs):
      self.values[t.ref()] = (v, extents)
    if op.type in _SUMS:
      self._sum_recipe(op)

  def _sum_recipe(self, op):
    """A recipe for a sum of values of one compact shape that each have one: the sum of
    their recipes (e.g. the q, k and v gradients summed before one SUM allreduce)."""
    recipes = [self.einsum_recipes.get(t.ref()) for t in op.inputs]
    if not recipes or any(r is None for r in recipes):
      return
    shapes = {tuple(tf.TensorShape(self.get(t)[0].shape).as_list()) for t in op.inputs}
    if len(shapes) != 1 or None in next(iter(shapes)):
      return

    def emit(drop_axes):
      parts = [r(drop_axes) for r in recipes]
      return parts[0] if len(parts) == 1 else tf.add_n(parts)
    self.einsum_recipes[op.outputs[0].ref()] = emit

  def _static_shape_op(self, op):
    shape = op.inputs[0].shape
    if not shape.is_fully_defined():
      raise _Fallback(op.type)
    dims = shape.as_list()
    value = {"Shape": dims, "Size": int(np.prod(dims)), "Rank": len(dims)}[op.type]
    return [tf.constant(value, dtype=op.outputs[0].dtype)]

  def _stacked_op(self, op, groups, attrs, extents):
    """Outputs of an op with a stacked input; they have `extents` (the inputs' union)."""
    kind = op.type
    if kind in _CWISE:
      return _call_raw(op, self._elementwise_args(op, groups, extents), attrs)
    if kind in _AXIS_INPUT or kind in _AXIS_ATTR:
      return self._axis_op(op, groups, attrs, extents)
    rule = getattr(self, "_rule_" + kind, None)
    if rule is None:
      raise _Fallback(kind)
    return rule(op, groups, attrs, extents)

  def _elementwise_args(self, op, groups, extents):
    """Inputs of an elementwise op with a stacked input, aligned for broadcasting; a known
    input of equal elements is passed as one element where the others give the shape."""
    kind = op.type
    rank = max(t.shape.rank for _, ts, _ in groups for t in ts)
    inputs = [t for _, ts, _ in groups for t in ts]
    out_shape = op.outputs[0].shape
    args = {}
    for name, ts, is_list in groups:
      vals = []
      for t in ts:
        scalar = None
        if kind not in _SAME_SHAPE and self.extents(t) is None:
          scalar = _splat_scalar(self.get(t)[0])
        if scalar is not None and out_shape.is_fully_defined():
          others = [o.shape for o in inputs if o is not t]
          try:
            covered = others and functools.reduce(
                tf.broadcast_static_shape, others).as_list() == out_shape.as_list()
          except ValueError:
            covered = False
          if covered:
            vals.append(scalar)
            continue
        vals.append(self.as_stacked(t, extents) if kind in _SAME_SHAPE else
                    self.aligned(t, rank))
      args[name] = vals if is_list else vals[0]
    return args

  def _plain(self, t):
    """Value of an input that must be the same on every core (e.g. a shape)."""
    v, extents = self.get(t)
    if extents is not None:
      raise _Fallback("per-core control input")
    return v

  def _data_args(self, groups, control_names, extents):
    args = {}
    for name, ts, is_list in groups:
      if name in control_names:
        vals = [self._plain(t) for t in ts]
      else:
        vals = [self.as_stacked(t, extents) for t in ts]
      args[name] = vals if is_list else vals[0]
    return args

  def _axis_op(self, op, groups, attrs, extents):
    axis_input = _AXIS_INPUT.get(op.type)
    if op.type == "Reverse":
      raise _Fallback(op.type)
    controls = {axis_input} if axis_input else set()
    args = self._data_args(groups, controls | _EXTRA_CONTROLS.get(op.type, set()), extents)
    if axis_input:
      args[axis_input] = _shift_axis(args[axis_input], self.k)
    else:
      name = _AXIS_ATTR[op.type]
      if attrs[name] >= 0:
        attrs[name] += self.k
    return _call_raw(op, args, attrs)

  def _rule_Einsum(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    equation = attrs["equation"].decode() if isinstance(attrs["equation"], bytes) else (
        attrs["equation"])
    if "." in equation:
      raise _Fallback("einsum with ellipsis")
    if not all(t.shape.is_fully_defined() for t in list(op.inputs) + list(op.outputs)):
      raise _Fallback("einsum of unknown shape")
    lhs, out = equation.split("->")
    free = [c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba" if c not in equation]
    if len(free) < self.k:
      raise _Fallback("einsum with too many labels")
    mesh_labels = free[:self.k]
    terms, values = [], []
    for term, t in zip(lhs.split(","), groups[0][1]):
      v, e = self.get(t)
      if e is not None:
        # Mesh axes of extent 1 are dropped: einsum pairs the others by label.
        kept = [i for i in range(self.k) if e[i] > 1]
        if len(kept) < self.k:
          v = direct_ops.reshape(v, [e[i] for i in kept] + t.shape.as_list())
        term = "".join(mesh_labels[i] for i in kept) + term
      terms.append(term)
      values.append(v)
    out_shape = op.outputs[0].shape.as_list()

    def emit(drop_axes):
      """The einsum with the mesh axes drop_axes also contracted (extent 1 after)."""
      out_extents = [1 if i in drop_axes else e for i, e in enumerate(extents)]
      kept = [i for i in range(self.k) if out_extents[i] > 1]
      equation = ",".join(terms) + "->" + "".join(mesh_labels[i] for i in kept) + out
      result = None
      if len(values) == 2:
        result = simd_matmul.folded_matmul(equation, values[0], values[1],
                                           frozenset(mesh_labels))
        if result is None:
          result = simd_matmul.batched_matmul(equation, values[0], values[1],
                                              frozenset(mesh_labels))
        if result is None:
          result = local_einsum.two_operand_matmul(equation, values[0], values[1])
      if result is None:
        result = _call_raw(op, {"inputs": values}, dict(attrs, equation=equation))[0]
      if len(kept) < self.k:
        result = direct_ops.reshape(result, out_extents + out_shape)
      return result
    self.einsum_recipes[op.outputs[0].ref()] = emit
    return [emit(())]

  def _rule_BatchMatMulV2(self, op, groups, attrs, extents):  # pylint: disable=invalid-name,unused-argument
    # Batch dims broadcast as numpy does, so the mesh axes are batch dims (an extent of 1
    # pairs with any) once both operands have the same per-slice rank.
    rank = max(t.shape.rank for _, ts, _ in groups for t in ts)
    return _call_raw(op, {name: self.aligned(ts[0], rank) for name, ts, _ in groups}, attrs)

  _rule_BatchMatMulV3 = _rule_BatchMatMulV2

  def _rule_MatMul(self, op, groups, attrs, extents):  # pylint: disable=invalid-name,unused-argument
    a, b = (self.as_stacked(ts[0]) for _, ts, _ in groups)
    return [tf.linalg.matmul(a, b, transpose_a=attrs.get("transpose_a", False),
                             transpose_b=attrs.get("transpose_b", False))]

  def _rule_Transpose(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    args = self._data_args(groups, {"perm"}, extents)
    static = tf.get_static_value(args["perm"])
    if static is not None:  # folded here: no Range/Add/Concat ops per transpose
      args["perm"] = np.concatenate([np.arange(self.k), np.asarray(static) + self.k]
                                    ).astype(np.int32)
    else:
      perm = tf.cast(args["perm"], tf.int32)
      args["perm"] = tf.concat([tf.range(self.k), perm + self.k], 0)
    return _call_raw(op, args, attrs)

  def _prepend(self, value, first):
    """The 1-D control tensor `value` with `first` in front (in numpy where known)."""
    known, head = tf.get_static_value(value), tf.get_static_value(first)
    if known is not None and head is not None:
      known = np.asarray(known)
      return np.concatenate([np.reshape(head, [-1]).astype(known.dtype),
                             np.reshape(known, [-1])])
    return tf.concat([tf.cast(tf.reshape(first, [-1]), value.dtype), value], 0)

  def _rule_Reshape(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    args = self._data_args(groups, {"shape"}, extents)
    args["shape"] = self._prepend(args["shape"], np.array(extents, np.int32))
    return _call_raw(op, args, attrs)

  def _rule_BroadcastTo(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    args = self._data_args(groups, {"shape"}, extents)
    args["input"] = self.aligned(op.inputs[0], len(op.outputs[0].shape))
    args["shape"] = self._prepend(args["shape"], np.array(extents, np.int32))
    return _call_raw(op, args, attrs)

  def _rule_Fill(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    dims = self._plain(op.inputs[0])
    value = tf.reshape(self.get(op.inputs[1])[0], extents + [1] * op.outputs[0].shape.rank)
    return [tf.broadcast_to(value, self._prepend(dims, np.array(extents, np.int32)))]

  def _rule_Tile(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    args = self._data_args(groups, {"multiples"}, extents)
    args["multiples"] = self._prepend(args["multiples"], np.ones([self.k], np.int32))
    return _call_raw(op, args, attrs)

  def _pad_rule(self, op, groups, attrs, extents):
    args = self._data_args(groups, {"paddings", "constant_values"}, extents)
    paddings = args["paddings"]
    if isinstance(paddings, np.ndarray):
      args["paddings"] = np.concatenate([np.zeros([self.k, 2], paddings.dtype), paddings])
    else:
      args["paddings"] = tf.concat([tf.zeros([self.k, 2], paddings.dtype), paddings], 0)
    return _call_raw(op, args, attrs)

  _rule_Pad = _rule_PadV2 = _rule_MirrorPad = _pad_rule

  def _rule_Slice(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    args = self._data_args(groups, {"begin", "size"}, extents)
    args["begin"] = self._prepend(args["begin"], np.zeros([self.k], np.int32))
    args["size"] = self._prepend(args["size"], -np.ones([self.k], np.int32))
    return _call_raw(op, args, attrs)

  def _last_axis_rule(self, op, groups, attrs, extents):  # pylint: disable=unused-argument
    """Softmax / LogSoftmax with the leading axes folded (CPU kernels take rank <= 5)."""
    v, _ = self.get(op.inputs[0])
    v = _as_tensor(v)
    if not v.shape.is_fully_defined():
      raise _Fallback("%s of a dynamic shape" % op.type)
    shape = v.shape.as_list()
    out = _call_raw(op, {"logits": direct_ops.reshape(v, [-1, shape[-1]])}, attrs)[0]
    return [direct_ops.reshape(out, shape)]

  _rule_Softmax = _rule_LogSoftmax = _last_axis_rule

  def _rule_GatherV2(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    axis = tf.get_static_value(self._plain(op.inputs[2]))
    if axis is None or axis < 0 or attrs.get("batch_dims", 0) < 0:
      raise _Fallback("gather with a dynamic or negative axis")
    params, indices = op.inputs[0], op.inputs[1]
    p_extents = self.extents(params)
    if (attrs.get("batch_dims", 0) == 0 and
        (p_extents is None or not any(e > 1 for e in p_extents))):
      # the same table on every core: one lookup at every core's indices
      table = direct_ops.reshape(self.get(params)[0], params.shape.as_list())
      out = tf.gather(table, self.as_stacked(indices), axis=axis)
      if axis:  # the mesh axes, after the table's first `axis` dims, go first
        rank = out.shape.rank
        out = tf.transpose(out, list(range(axis, axis + self.k)) + list(range(axis)) +
                           list(range(axis + self.k, rank)))
      return [out]
    # per-core tables: the mesh axes become batch dims of the lookup
    args = {"params": self.as_stacked(params, extents),
            "indices": self.as_stacked(indices, extents),
            "axis": tf.constant(axis + self.k, op.inputs[2].dtype)}
    attrs = dict(attrs, batch_dims=attrs.get("batch_dims", 0) + self.k)
    return _call_raw(op, args, attrs)

  def _rule_UnsortedSegmentSum(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    data, ids = op.inputs[0], op.inputs[1]
    n = tf.get_static_value(self._plain(op.inputs[2]))
    if n is None or not data.shape.is_fully_defined():
      raise _Fallback("segment sum of unknown size")
    cores = int(np.prod(extents))
    # core c sums into segments [c * n, (c + 1) * n); negative ids stay dropped
    offsets = np.arange(cores, dtype=np.int64).reshape(
        list(extents) + [1] * ids.shape.rank) * int(n)
    seg = self.as_stacked(ids, extents)
    seg = tf.where(seg >= 0, seg + tf.constant(offsets, seg.dtype), -1)
    rest = data.shape.as_list()[ids.shape.rank:]
    total = tf.math.unsorted_segment_sum(self.as_stacked(data, extents), seg, cores * int(n))
    return [direct_ops.reshape(total, list(extents) + [int(n)] + rest)]

  def _rule_StridedSlice(self, op, groups, attrs, extents):  # pylint: disable=invalid-name
    args = self._data_args(groups, {"begin", "end", "strides"}, extents)
    zeros, ones = np.zeros([self.k], np.int32), np.ones([self.k], np.int32)
    args["begin"] = self._prepend(args["begin"], zeros)
    args["end"] = self._prepend(args["end"], zeros)
    args["strides"] = self._prepend(args["strides"], ones)
    all_mesh = (1 << self.k) - 1
    for mask in ("begin_mask", "end_mask"):
      attrs[mask] = (attrs[mask] << self.k) | all_mesh
    for mask in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask"):
      attrs[mask] = attrs[mask] << self.k
    return _call_raw(op, args, attrs)


def _trace(fn, args, stacked_positions, k):
  """Traces fn on slice-shaped placeholders; returns (graph, placeholders, outputs)."""
  graph = speed_layer.internals().FuncGraph("simd_slice_fn")
  with graph.as_default():
    placeholders = {i: tf.compat.v1.placeholder(args[i].dtype, args[i].shape[k:])
                    for i in stacked_positions}
    outputs = fn(*[placeholders.get(i, a) for i, a in enumerate(args)])
  return graph, placeholders, outputs


def _cached_trace(fn, args, stacked_positions, k):
  """_trace, or the trace of an earlier call with the same key in this graph."""
  if tf.executing_eagerly():
    return _trace(fn, args, stacked_positions, k)
  # call_key -> (trace graph, placeholders, outputs)
  cache = slice_fn_key.graph_cache(tf.compat.v1.get_default_graph(), "simd_traces")
  key = slice_fn_key.call_key(fn, args, set(stacked_positions), k)
  found = cache.get(key) if key is not None else None
  if found is not None:
    stats["trace_reused"] += 1
    return found
  traced = _trace(fn, args, stacked_positions, k)
  if key is not None and not (_control_captures(traced[0]) or any(
      op.op_def.is_stateful for op in traced[0].get_operations())):
    cache[key] = traced
  return traced


def _control_captures(graph):
  """Ops of outer graphs the trace's ops must run after (tf.control_dependencies in fn)."""
  return getattr(getattr(graph, "function_captures", None), "control", None) or []


def _replay(graph, placeholders, outputs, args, mesh_shape, recipes, input_recipes=None):
  replay = _Replay(mesh_shape)
  for i, p in placeholders.items():
    replay.values[p.ref()] = (args[i], args[i].shape.as_list()[:replay.k])
    if input_recipes and input_recipes.get(i) is not None:
      replay.einsum_recipes[p.ref()] = input_recipes[i]
  for external, internal in graph.captures:
    replay.values[internal.ref()] = (external, None)
  control = [c for c in _control_captures(graph) if not tf.executing_eagerly()]
  multi = isinstance(outputs, (tuple, list))
  outs = list(outputs) if multi else [outputs]
  if not all(direct_ops.of_graph(o, graph) for o in outs):
    raise _Fallback("fn returned a value not computed in its trace")
  with tf.control_dependencies(control):
    for op in graph.get_operations():
      if op.type == "Placeholder" and any(o.ref() in replay.values for o in op.outputs):
        continue
      if op.control_inputs:
        raise _Fallback("control dependencies inside fn")
      replay.run(op)
    results = [tf.convert_to_tensor(replay.as_stacked(o)) for o in outs]
    if control:
      results = [tf.identity(r) for r in results]
    elif recipes is not None:
      for i, o in enumerate(outs):
        if o.ref() in replay.einsum_recipes:
          recipes[i] = replay.einsum_recipes[o.ref()]
  return tuple(results) if multi else results[0]


def run_slicewise(fn, args, stacked_positions, mesh_shape, recipes=None,
                  input_recipes=None):
  """fn on each core's slices; args at stacked_positions are compact [*extents, *slice].

  If `recipes` is a dict, recipes[i] is set for each output i that is one einsum of the
  trace (or a sum of such, or of inputs with `input_recipes`, {position: recipe}):
  recipe(drop_axes) emits it SUM-allreduced over the mesh axes drop_axes without storing
  per-core partial sums. Returns a compact tf.Tensor (a tuple for several outputs).
  """
  if not speed_layer.enabled():
    stats["plain"] += 1
    stats["vectorized_map"] += 1
    return _vectorized_map(fn, args, stacked_positions, list(mesh_shape))
  k = len(mesh_shape)
  graph, placeholders, outputs = _cached_trace(fn, args, stacked_positions, k)
  try:
    result = _replay(graph, placeholders, outputs, args, mesh_shape, recipes,
                     input_recipes)
    stats["replay"] += 1
    return result
  except _Fallback as reason:
    stats["vectorized_map"] += 1
    stats["fallback:" + str(reason)] += 1
  return _vectorized_map(fn, args, stacked_positions, list(mesh_shape))


def _vectorized_map(fn, args, stacked_positions, mesh_shape):
  """tf.vectorized_map over all cores (every stacked arg broadcast to the full mesh)."""
  k, num_cores = len(mesh_shape), int(np.prod(mesh_shape))
  stacked = []
  for i in stacked_positions:
    a = args[i]
    full = broadcast_extents(a, a.shape.as_list()[:k], mesh_shape)
    stacked.append(tf.reshape(full, [num_cores] + a.shape.as_list()[k:]))

  def one_core(slices):
    given = dict(zip(stacked_positions, slices))
    out = fn(*[given.get(i, a) for i, a in enumerate(args)])
    return tuple(out) if isinstance(out, list) else out
  out = tf.vectorized_map(one_core, stacked)
  unflat = lambda o: tf.reshape(o, mesh_shape + o.shape.as_list()[1:])
  return tuple(unflat(o) for o in out) if isinstance(out, tuple) else unflat(out)
