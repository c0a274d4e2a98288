"""Builds one slice function's TF ops for the next device by copying the first device's.

PlacementMeshImpl runs a slice function once per device, and most of a traced step's
build time is TF's Python op construction. For another device whose arguments have the
same dtypes, static shapes and aliasing, the ops one call made are copied directly from
their recorded type, attrs and dtypes. Where a copy could differ from a fresh call (eager
execution, a gradient tape, stateful ops, colocation, ops placed by the function itself,
arguments from an outer graph) the function is run again instead. A replay given a
device reuses the Consts that device already has. Recordings are kept per graph under
`slice_fn_key.call_key`, so a later call of the same computation copies them too.

Part of the speed layer (`mesh_tf.lowering.speed_layer`): with it off,
`direct_ops.graph_for` answers None and every call runs the function.
"""
import collections

import tensorflow as tf

from mesh_tf.backends import slice_fn_key
from mesh_tf.lowering import direct_ops

# How slice functions were run: "recorded" (called, ops kept as a recipe), "called" (no
# recipe possible), "replayed" (ops copied for another device).
stats = collections.Counter()


def _signature(args, graph):
  """What a recorded call must share with a new one: each argument's kind, dtype, static
  shape and aliasing; None where a tensor is from another graph (e.g. a loop's outer)."""
  out, first_seen = [], {}
  for a in args:
    if isinstance(a, tf.Tensor):
      if not direct_ops.of_graph(a, graph):
        return None
      alias = first_seen.setdefault(a.ref(), len(first_seen))
      out.append(("tensor", a.dtype, tuple(a.shape.as_list()) if a.shape.rank is not None
                  else None, alias))
    else:
      out.append(("python", id(a)))
  return tuple(out)


def _signature_once(args, graph):
  """_signature(args, graph), computed once per argument list."""
  last = slice_fn_key.graph_cache(graph, "last signature")
  if None in last and last[None][0] is args:
    return last[None][1]
  signature = _signature(args, graph)
  last[None] = (args, signature)
  return signature


def _copyable(result, ops, node_defs):
  """Whether copies of ops (whose NodeDefs are node_defs), with other inputs, compute
  what a fresh call would."""
  leaves = result if isinstance(result, (tuple, list)) else [result]
  if not ops or not all(isinstance(t, tf.Tensor) for t in leaves):
    return False
  if len({op.device for op in ops}) != 1:  # the function placed some ops itself
    return False
  # InplaceUpdate writes into its input's buffer: it runs as written on each device
  # (models/transformer/cache_write.py), so no copy or shared call can reorder it.
  return not any(op.op_def.is_stateful or "_class" in node_def.attr or
                 op.type in ("Placeholder", "PartitionedCall", "StatefulPartitionedCall",
                             "InplaceUpdate")
                 for op, node_def in zip(ops, node_defs))


def _constant_key(op, attrs):
  """What makes two recorded Consts interchangeable, or None for any other op."""
  if op.type != "Const" or op.inputs or op.control_inputs:
    return None
  return (attrs["dtype"].type, attrs["value"].SerializeToString())


class RecordedCall:
  """The ops one call of a slice function created, and how its result is made of them
  (kept in the graph_cache "recordings", by call_key)."""

  def __init__(self, graph, args, ops, result, node_defs=None):
    self._graph = graph
    self._signature = _signature_once(args, graph)
    self._arg_index = {a.ref(): i for i, a in enumerate(args) if isinstance(a, tf.Tensor)}
    # what create_op needs, read once (op.node_def serializes a proto at each access)
    self._recipes = []
    if node_defs is None:
      node_defs = [op.node_def for op in ops]
    for op, node_def in zip(ops, node_defs):
      attrs = {k: node_def.attr[k] for k in node_def.attr}
      self._recipes.append((op, op.type, list(op.inputs), [t.dtype for t in op.outputs],
                            attrs, op.op_def, list(op.control_inputs),
                            _constant_key(op, attrs)))
    self._result = result

  @staticmethod
  def _graph_to_record_in(args):
    """The graph being built, where copies of ops could stand for calls; else None."""
    graph = direct_ops.graph_for()  # a graph no tape watches
    return graph if graph is not None and _signature_once(args, graph) is not None else None

  @staticmethod
  def _key(fn, args):
    return slice_fn_key.call_key(
        fn, args, {i for i, a in enumerate(args) if isinstance(a, tf.Tensor)}, 0)

  @classmethod
  def earlier(cls, fn, args):
    """A RecordedCall of an earlier call in this graph that fn(*args) would repeat (same
    code, closure values and slice shapes), or None."""
    graph = cls._graph_to_record_in(args)
    if graph is None:
      return None
    code = getattr(fn, "__code__", None)
    if code is not None and code not in slice_fn_key.graph_cache(graph, "recorded code"):
      return None  # no recording can match: spare the key
    key = cls._key(fn, args)
    # record() is asked next, with these very arguments, where this misses
    slice_fn_key.graph_cache(graph, "last miss")[None] = (fn, args, key)
    return None if key is None else slice_fn_key.graph_cache(graph, "recordings").get(key)

  @classmethod
  def record(cls, fn, args):
    """(fn(*args), a RecordedCall or None where copying could not reproduce a call)."""
    graph = cls._graph_to_record_in(args)
    if graph is None:
      stats["called"] += 1
      return fn(*args), None
    start = graph.num_operations()
    result = fn(*args)
    ops = graph.get_operations()[start:]
    node_defs = [op.node_def for op in ops]  # each access serializes the proto
    if not _copyable(result, ops, node_defs):
      stats["called"] += 1
      return result, None
    stats["recorded"] += 1
    recorded = cls(graph, args, ops, result, node_defs)
    # a later call may be under other control dependencies than this one's
    if not any(op.control_inputs for op in ops):
      last = slice_fn_key.graph_cache(graph, "last miss").pop(None, None)
      key = last[2] if last and last[0] is fn and last[1] is args else cls._key(fn, args)
      if key is not None:
        slice_fn_key.graph_cache(graph, "recordings")[key] = recorded
        slice_fn_key.graph_cache(graph, "recorded code")[getattr(fn, "__code__", None)] = True
    return result, recorded

  def replay(self, args, device=None):
    """The result of the recorded function on args, from copies of its ops; None when
    args do not match the recorded call. With a device (the one the caller's scope puts
    the copies on), constants that device already has are reused."""
    if _signature_once(args, self._graph) != self._signature:
      return None
    made, constants = {}, None
    # a reused constant would miss the control inputs of the caller's scope
    if device is not None and not self._graph._control_dependencies_stack:  # pylint: disable=protected-access
      constants = slice_fn_key.graph_cache(self._graph, "constants")

    def mapped(t):
      index = self._arg_index.get(t.ref())
      if index is not None:
        return args[index]
      copy = made.get(t.op)
      return t if copy is None else copy.outputs[t.value_index]
    for op, op_type, inputs, dtypes, attrs, op_def, control_inputs, const in self._recipes:
      if constants is not None and const is not None:
        shared = constants.get((device,) + const)
        if shared is not None:
          made[op] = shared.op
          continue
      # Graph.create_op without its deprecation wrapper, which inspects the arguments of
      # every call (as long again as making the op)
      copy = self._graph._create_op_internal(  # pylint: disable=protected-access
          op_type, [mapped(t) for t in inputs], dtypes, name=op_type, attrs=attrs,
          op_def=op_def)
      for c in control_inputs:
        c = made.get(c, c)
        if c not in copy.control_inputs:  # those of the caller's scope come by themselves
          copy._add_control_input(c)  # pylint: disable=protected-access
      made[op] = copy
      if constants is not None and const is not None:
        constants[(device,) + const] = copy.outputs[0]
    stats["replayed"] += 1
    if isinstance(self._result, (tuple, list)):
      return type(self._result)(mapped(t) for t in self._result)
    return mapped(self._result)

