"""Builds the other devices' copies of a run of slice computations as one function.

Making PlacementMeshImpl's per-device ops in Python is most of a traced step's build
time. So, while a step is traced, a slice computation whose inputs differ between devices
is run for the first device only and joins the open `Segment` of its graph. When code
first reads another device's slice (a collective, an export, an assign), the segment's
first-device ops become one function (made in C++) and each other device gets one call
of it (a segment of fewer than MIN_FUNCTION_OPS ops is copied with slice_replay instead).
A segment covers one partition of the devices (`reps`); only what slice_replay could copy
is deferred, and anything else runs per device after completing the segments it reads.

Part of the speed layer (`mesh_tf.lowering.speed_layer`): TF's private internals used
here are probed there, and segments are only opened while it is on (placement asks
`direct_ops.graph_for`, None with the layer off).
"""
import collections
import itertools

from absl import logging
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import function_pb2

from mesh_tf.backends import slice_fn_key
from mesh_tf.backends import slice_replay
from mesh_tf.lowering import speed_layer

# "deferred" slice calls; "segments" completed by function calls, "copied segments";
# "late segments" (results read after their segment completed); "functions failed".
stats = collections.Counter()

# Below this many ops a segment's copies are cheaper to make than a function and calls.
MIN_FUNCTION_OPS = 8

_names = itertools.count()


_slice_function_class = None


def _slice_function(name, inputs, outputs):
  """An AtomicFunction whose FunctionType (which only a gradient or an export asks for) is
  made when first asked (the class is made at first use, from the speed layer's probes)."""
  global _slice_function_class
  if _slice_function_class is None:
    internals = speed_layer.internals()

    class _SliceFunction(internals.atomic_function.AtomicFunction):
      __slots__ = ("_specs",)

      def __init__(self, name, inputs, outputs):
        super().__init__(name, internals.context.context(), None)
        self._specs = [[(t.shape, t.dtype) for t in ts] for ts in (inputs, outputs)]

      @property
      def function_type(self):
        if self._function_type is None:
          inputs, outputs = [tuple(tf.TensorSpec(s, d) for s, d in ts)
                             for ts in self._specs]
          self._function_type = internals.function_type.from_structured_signature(
              (inputs, {}), outputs, {})
        return self._function_type
    _slice_function_class = _SliceFunction
  return _slice_function_class(name, inputs, outputs)


def graph_function(graph, ops, inputs, outputs):
  """An AtomicFunction computing `outputs` from `inputs` with `ops` of `graph` (which
  must hold every op between them), its nodes unplaced so a call places them."""
  internals = speed_layer.internals()
  pywrap_tf_session, compat = internals.pywrap_tf_session, internals.compat
  name = "mtf_slices_%d" % next(_names)
  with graph._c_graph.get() as c_graph:  # pylint: disable=protected-access
    fn = pywrap_tf_session.TF_GraphToFunction_wrapper(
        c_graph, name, False, [op._c_op for op in ops],  # pylint: disable=protected-access
        [t._as_tf_output() for t in inputs],  # pylint: disable=protected-access
        [t._as_tf_output() for t in outputs],  # pylint: disable=protected-access
        [], [], [], None, "")
  try:
    with internals.c_api_util.tf_buffer() as buf:
      pywrap_tf_session.TF_FunctionToFunctionDef(fn, buf)
      data = pywrap_tf_session.TF_GetBuffer(buf)
  finally:
    pywrap_tf_session.TF_DeleteFunction(fn)
  definition = function_pb2.FunctionDef()
  definition.ParseFromString(compat.as_bytes(data))
  for node in definition.node_def:
    node.ClearField("device")
  internals.context.context().add_function_def(definition)
  return _slice_function(definition.signature.name, inputs, outputs)


class Segment:
  """First-device slice computations of one graph over one device partition, whose
  other devices' results are made together by `complete`."""

  def __init__(self, graph, reps, devices):
    self.graph = graph
    self.reps = reps
    self._devices = devices
    self._ops, self._op_set = [], set()
    self._laid_out_inputs = {}  # first-device tensor ref -> the LaidOutTensor it is of
    self._results = []          # first-device result tensors, in order
    self._waiting = []          # (laid-out tensor, index into _results)
    self._late = []             # those the calls left out, made if read after all
    self.completed = False

  def accepts(self, ops, results):
    """Whether ops (one first-device call's, copyable) can be made for the other
    devices by a function call: no control inputs, results made by the segment."""
    if any(op.control_inputs for op in ops):
      return False
    made = set(ops)
    return all(t.op in made or t.op in self._op_set for t in results)

  def add(self, ops, laid_out_inputs, results, make_laid_out):
    """Joins one call: its first-device ops, the laid-out tensors it read (by their
    first-device tensors) and results; returns laid-out results waiting on this."""
    for x in laid_out_inputs:
      self._laid_out_inputs.setdefault(x.first_slice.ref(), x)
    self._ops.extend(ops)
    self._op_set.update(ops)
    stats["deferred"] += 1
    outs = []
    for t in results:
      lot = make_laid_out([t] + [None] * (len(self.reps) - 1), pending=self)
      self._waiting.append((lot, len(self._results)))
      self._results.append(t)
      outs.append(lot)
    return outs

  def conflicts(self, laid_out):
    """Whether two laid-out tensors (of laid_out, or one of them already an input)
    share processor 0's tensor but not the others': a function input named by that
    tensor would have two meanings."""
    mine = {}
    for x in laid_out:
      ref = x.first_slice.ref()
      for known in (self._laid_out_inputs.get(ref), mine.setdefault(ref, x)):
        if known is not None and known is not x and any(
            a is not b for a, b in zip(known.peek_slices(), x.peek_slices())):
          return True
    return False

  def complete(self, reader=None):
    """Makes the other devices' results once per distinct slice computation (calls of a
    function of the first-device ops, or copies for a few ops) and fills in the waiting
    laid-out tensors. The calls return only `reader` and the results whose
    `read_later()` is true; a result left out and read after all is made then, by one
    more call per device of a function of every result left out."""
    if self.completed:
      late, self._late = self._late, []
      if late:
        stats["late segments"] += 1
        self._make(late, copy=False)
      return
    self.completed = True
    copy = len(self._ops) < MIN_FUNCTION_OPS  # copies make every op anyway
    now, self._late = [], []
    for lot, index in self._waiting:
      keep = copy or lot is reader or lot.read_later()
      (now if keep else self._late).append((lot, index))
    self._waiting = []
    called = self._make(now, copy) if now else not copy
    stats["segments" if called else "copied segments"] += 1

  def _make(self, waiting, copy):
    """Fills in the waiting (laid-out tensor, result index) pairs: copies of the ops,
    or calls of a function of the ops; whether it made calls."""
    results = [self._results[i] for _, i in waiting]
    consts, inputs = self._closure()
    ops = consts + self._ops  # TF drops what the results do not need
    recording, caller = None, None
    if copy:
      recording = slice_replay.RecordedCall(self.graph, inputs, ops, results)
    per_rep = {0: results}
    with self.graph.as_default(), self.graph.control_dependencies(None):
      for rep in sorted(set(self.reps) - {0}):
        args = []
        for t in inputs:
          x = self._laid_out_inputs.get(t.ref())
          args.append(t if x is None else x.tensor_list[rep])
        with self.graph.device(self._devices[rep]):
          # None where this processor's inputs alias otherwise than the first's
          out = recording.replay(args, self._devices[rep]) if recording else None
          if out is None:
            if caller is None:
              caller = self._caller(ops, inputs, results)
            out = caller(args, self._devices[rep])
        per_rep[rep] = out
    for j, (lot, _) in enumerate(waiting):
      lot.fill([per_rep[rep][j] for rep in self.reps])
    return caller is not None

  def _caller(self, ops, inputs, results):
    """A _Caller of a function of ops computing results; where TF cannot make that
    function, one that copies the ops instead, with a warning."""
    try:
      return _Caller(self.graph, graph_function(self.graph, ops, inputs, results),
                     inputs, results)
    except (tf.errors.OpError, ValueError, TypeError) as e:
      reason = "%s: %s" % (type(e).__name__, e)
    stats["functions failed"] += 1
    logging.warning("mesh_tf: copying %d slice ops per device instead of calling a "
                    "function of them (%s)", len(ops), reason)
    recording = slice_replay.RecordedCall(self.graph, inputs, ops, results)

    def copy(args, device):
      out = recording.replay(args, device)
      if out is None:
        raise ValueError("processor 0's slice ops could not be made for device %s, as "
                         "a function (%s) or as copies (its inputs alias otherwise)"
                         % (device, reason))
      return out
    return copy

  def _closure(self):
    """(plain constants the segment's ops read, which copies may hold themselves; the
    other tensors they read from outside, in first-use order)."""
    consts, inputs, seen = [], [], set()
    for op in self._ops:
      for t in op.inputs:
        if t.op in self._op_set or t.ref() in seen:
          continue
        seen.add(t.ref())
        # not a laid-out input's first slice (e.g. processor 0's pnum): the others
        # have their own
        if _is_plain_const(t.op) and t.ref() not in self._laid_out_inputs:
          if t.op not in consts:
            consts.append(t.op)
        else:
          inputs.append(t)
    return consts, inputs


class _Caller:
  """Makes PartitionedCall ops of one stateless function in a graph (what
  AtomicFunction.call_flat does, less its per-call work for resource inputs)."""

  def __init__(self, graph, function, inputs, outputs):
    graph._add_function_recursive(function)  # pylint: disable=protected-access
    self._internals = internals = speed_layer.internals()
    self._graph = graph
    self._function = function
    self._in_shapes = [t.shape for t in inputs]
    self._concrete = None
    self._out_dtypes = [t.dtype for t in outputs]
    # (dims with -1 for unknown, unknown rank) of each output: what Tensor.set_shape
    # hands TF after converting its argument, converted once here
    self._out_shapes = [([-1 if d is None else d for d in t.shape.as_list()], False)
                        if t.shape.rank is not None else ([], True) for t in outputs]
    config = internals.context.context().function_call_options.config_proto_serialized
    self._attrs = {
        "Tin": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            type=[t.dtype.as_datatype_enum for t in inputs])),
        "Tout": attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            type=[d.as_datatype_enum for d in self._out_dtypes])),
        "f": attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(
            name=internals.compat.as_str(function.name))),
        "config_proto": attr_value_pb2.AttrValue(s=config),
        "executor_type": attr_value_pb2.AttrValue(s=b""),
        # the outputs' shapes are set from the first device's: without this TF infers
        # them by running shape inference over the function body at every call
        "_disable_call_shape_inference": attr_value_pb2.AttrValue(b=True),
    }

  def _gradient(self, op, *output_grads):
    """A call's gradient (a tape differentiating the traced step), from a ConcreteFunction
    of the body built when first asked."""
    if self._concrete is None:
      internals = self._internals
      body = internals.function_def_to_graph.function_def_to_graph(
          self._function.definition, input_shapes=self._in_shapes)
      self._concrete = internals.concrete_function.ConcreteFunction.from_func_graph(
          body, self._function.function_type, {})
    return self._concrete._get_gradient_function()(op, *output_grads)  # pylint: disable=protected-access

  def __call__(self, args, device=None):  # pylint: disable=unused-argument
    """The call's outputs (the graph's device scope places it, not `device`)."""
    with self._graph._override_gradient_function(  # pylint: disable=protected-access
        {"PartitionedCall": self._gradient}):
      op = self._graph._create_op_internal(  # pylint: disable=protected-access
          "PartitionedCall", args, self._out_dtypes, name="PartitionedCall",
          attrs=self._attrs)
    for o, (dims, unknown_rank) in zip(op.outputs, self._out_shapes):
      o._set_shape(dims, unknown_rank)  # pylint: disable=protected-access
    return op.outputs


def _is_plain_const(op):
  return op.type == "Const" and not op.control_inputs


def open_segment(graph, owner, reps, devices):
  """The graph's open segment of `owner` (a mesh impl) over partition reps, made if
  none is open."""
  segments = slice_fn_key.graph_cache(graph, "segments")
  key = (owner, reps)
  segment = segments.get(key)
  if segment is None or segment.completed:
    segment = segments[key] = Segment(graph, reps, devices)
  return segment
