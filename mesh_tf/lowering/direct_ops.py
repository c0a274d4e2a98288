"""The lowering's most frequent TF ops, made directly in the graph being built.

A TF API call spends 100-300 us in Python per op; inside a traced step with no tape
watching, these functions make the same op from its type, inputs and attrs (about 40 us),
and TF's C code still infers and checks its shapes. Anywhere else (eagerly, under a tape,
other graphs or dtypes), and with the speed layer off, they call the TF API.
"""
import functools

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from mesh_tf.lowering import speed_layer


def of_graph(t, graph):
  """Whether t is a symbolic tf.Tensor of graph (not an eager tensor)."""
  return isinstance(t, tf.Tensor) and getattr(t, "graph", None) is graph


def graph_for(*tensors):
  """The graph being built, where ops on tensors (tf.Tensors of that very graph) may be
  made directly; else None (always, with the speed layer off)."""
  internals = speed_layer.active()
  if internals is None or tf.executing_eagerly() or internals.could_possibly_record():
    return None
  graph = tf.compat.v1.get_default_graph()
  return graph if all(of_graph(t, graph) for t in tensors) else None


@functools.lru_cache(maxsize=None)
def _type_attr(dtype):
  return attr_value_pb2.AttrValue(type=dtype.as_datatype_enum)


@functools.lru_cache(maxsize=None)
def _int_attr(value):
  return attr_value_pb2.AttrValue(i=value)


@functools.lru_cache(maxsize=None)
def _bool_attr(value):
  return attr_value_pb2.AttrValue(b=value)


@functools.lru_cache(maxsize=4096)
def _int32_vector_attrs(values):
  proto = tf.make_tensor_proto(np.asarray(values, np.int32))
  return {"value": attr_value_pb2.AttrValue(tensor=proto), "dtype": _type_attr(tf.int32)}


def _make(graph, op_type, inputs, dtypes, attrs):
  """The tf.Operation (_create_op_internal: create_op's deprecation wrapper is slow)."""
  return graph._create_op_internal(  # pylint: disable=protected-access
      op_type, inputs, dtypes, name=op_type, attrs=attrs)


def _op(graph, op_type, inputs, dtype, attrs):
  """The one output of a new op."""
  return _make(graph, op_type, inputs, [dtype], attrs).outputs[0]


def constant(value):
  """tf.constant(value) of a numpy array (of numbers or bools)."""
  graph = graph_for()
  if graph is None or value.dtype.kind not in "biufc":
    return tf.constant(value)
  dtype = tf.as_dtype(value.dtype)
  return _op(graph, "Const", [], dtype,
             {"value": attr_value_pb2.AttrValue(tensor=tf.make_tensor_proto(value)),
              "dtype": _type_attr(dtype)})


def _int32_vector(graph, values):
  return _op(graph, "Const", [], tf.int32, _int32_vector_attrs(tuple(values)))


_NUMERIC = (tf.bfloat16, tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
# tf function -> (op type, output dtype or None for the inputs', dtypes it covers)
_BINARY = {
    tf.math.add: ("AddV2", None, _NUMERIC),
    tf.math.subtract: ("Sub", None, _NUMERIC),
    tf.math.multiply: ("Mul", None, _NUMERIC),
    tf.math.truediv: ("RealDiv", None, (tf.bfloat16, tf.float16, tf.float32, tf.float64)),
    tf.math.minimum: ("Minimum", None, _NUMERIC),
    tf.math.maximum: ("Maximum", None, _NUMERIC),
    tf.math.less: ("Less", tf.bool, _NUMERIC),
    tf.math.greater: ("Greater", tf.bool, _NUMERIC),
    tf.math.less_equal: ("LessEqual", tf.bool, _NUMERIC),
    tf.math.greater_equal: ("GreaterEqual", tf.bool, _NUMERIC),
    tf.math.logical_and: ("LogicalAnd", tf.bool, (tf.bool,)),
    tf.math.logical_or: ("LogicalOr", tf.bool, (tf.bool,)),
}


def binary(tf_fn, x, y):
  """tf_fn(x, y) for a binary elementwise TF function (tf.add, tf.multiply, tf.less...)."""
  entry = _BINARY.get(tf_fn)
  graph = graph_for(x, y) if entry is not None else None
  if graph is None or x.dtype != y.dtype or x.dtype not in entry[2]:
    return tf_fn(x, y)
  op_type, out_dtype, _ = entry
  attrs = {} if x.dtype == tf.bool else {"T": _type_attr(x.dtype)}
  return _op(graph, op_type, [x, y], out_dtype or x.dtype, attrs)


def add_n(xs):
  """tf.math.add_n(xs) of two or more tensors of one dtype (add_n's checks of its list
  argument take longer than making the op: ~0.2 ms for 8)."""
  graph = graph_for(*xs)
  if graph is None or len(xs) < 2 or len({x.dtype for x in xs}) != 1:
    return tf.math.add_n(xs)
  return _op(graph, "AddN", list(xs), xs[0].dtype,
             {"N": _int_attr(len(xs)), "T": _type_attr(xs[0].dtype)})


_REDUCE = {tf.math.reduce_sum: "Sum", tf.math.reduce_mean: "Mean", tf.math.reduce_max: "Max",
           tf.math.reduce_min: "Min"}


def reduce(tf_fn, x, axes):
  """tf_fn(x, axis=axes) for tf.reduce_sum, _mean, _max or _min of a float tensor over
  a list of axes (ints)."""
  graph = graph_for(x)
  if (graph is None or tf_fn not in _REDUCE or not x.dtype.is_floating or
      not all(isinstance(a, int) for a in axes)):
    return tf_fn(x, axis=axes)
  return _op(graph, _REDUCE[tf_fn], [x, _int32_vector(graph, axes)], x.dtype,
             {"T": _type_attr(x.dtype), "Tidx": _type_attr(tf.int32),
              "keep_dims": _bool_attr(False)})


_ATTR_VALUES = {
    "int": _int_attr,
    "bool": _bool_attr,
    "float": lambda v: attr_value_pb2.AttrValue(f=v),
    "string": lambda v: attr_value_pb2.AttrValue(s=v if isinstance(v, bytes) else v.encode()),
    "list(int)": lambda v: attr_value_pb2.AttrValue(
        list=attr_value_pb2.AttrValue.ListValue(i=list(v))),
}


def like(op, inputs, attrs):
  """A new op of op's type on inputs (by op_def input name: a tensor, a numpy array or
  a list of them) with attrs (op_def name: Python value) changed from op's, where the
  types and counts inferred from the inputs are op's own; its outputs (a list). None
  where it cannot be made directly: then tf.raw_ops makes it."""
  graph = graph_for()
  if graph is None:
    return None
  flat = []
  for arg in op.op_def.input_arg:
    value = inputs[arg.name]
    values = [constant(v) if isinstance(v, np.ndarray) else v
              for v in (value if isinstance(value, list) else [value])]
    if not all(of_graph(t, graph) for t in values):
      return None
    inferred = {}
    if arg.number_attr:
      inferred[arg.number_attr] = len(values)
    if arg.type_attr:
      inferred[arg.type_attr] = values[0].dtype if values else None
    if arg.type_list_attr:
      inferred[arg.type_list_attr] = [t.dtype for t in values]
    if arg.type and any(t.dtype.as_datatype_enum != arg.type for t in values):
      return None
    if any(op.get_attr(name) != v for name, v in inferred.items()):
      return None
    flat.extend(values)
  node_attrs = op.node_def.attr
  new_attrs = {k: node_attrs[k] for k in node_attrs if not k.startswith("_")}
  kinds = {a.name: a.type for a in op.op_def.attr}
  counts = {a.number_attr for a in op.op_def.output_arg if a.number_attr}
  for name, value in attrs.items():
    if name not in kinds:
      return None
    make = _ATTR_VALUES.get(kinds[name])
    if make is not None and not (name in counts and value != op.get_attr(name)):
      new_attrs[name] = make(value)
    elif value != op.get_attr(name):
      # a changed attr of a kind not converted here (a type: the outputs' dtypes would
      # change) or one the number of outputs follows
      return None
  return _make(graph, op.type, flat, [t.dtype for t in op.outputs], new_attrs).outputs


def identity(x):
  """tf.identity(x) of a tensor (placed by the caller's device scope)."""
  graph = graph_for(x)
  if graph is None:
    return tf.identity(x)
  return _op(graph, "Identity", [x], x.dtype, {"T": _type_attr(x.dtype)})


def transpose(x, perm):
  """tf.transpose(x, perm)."""
  graph = graph_for(x)
  if graph is None:
    return tf.transpose(x, perm)
  return _op(graph, "Transpose", [x, _int32_vector(graph, perm)], x.dtype,
             {"T": _type_attr(x.dtype), "Tperm": _type_attr(tf.int32)})


def reshape(x, shape):
  """tf.reshape(x, shape) for a shape given as Python ints."""
  graph = graph_for(x)
  if graph is None or not all(isinstance(s, int) for s in shape):
    return tf.reshape(x, shape)
  return _op(graph, "Reshape", [x, _int32_vector(graph, shape)], x.dtype,
             {"T": _type_attr(x.dtype), "Tshape": _type_attr(tf.int32)})


def einsum(equation, *operands):
  """tf.einsum(equation, *operands) for one or two operands of one dtype and an
  equation with an output and no ellipsis."""
  graph = graph_for(*operands)
  if (graph is None or not 1 <= len(operands) <= 2 or "->" not in equation or
      "." in equation or " " in equation or len({x.dtype for x in operands}) != 1 or
      not operands[0].dtype.is_floating):
    return tf.einsum(equation, *operands)
  dtype = operands[0].dtype
  return _op(graph, "Einsum", list(operands), dtype,
             {"equation": attr_value_pb2.AttrValue(s=equation.encode()),
              "N": _int_attr(len(operands)), "T": _type_attr(dtype)})


def matmul(a, b, adjoint_a=False, adjoint_b=False):
  """tf.linalg.matmul(a, b, adjoint_a=..., adjoint_b=...) of real float tensors of one
  dtype and known rank (a MatMul at rank 2, as the API makes, else BatchMatMulV2)."""
  graph = graph_for(a, b)
  rank = a.shape.rank if graph is not None else None
  if (rank is None or b.shape.rank != rank or rank < 2 or a.dtype != b.dtype or
      not a.dtype.is_floating):
    return tf.linalg.matmul(a, b, adjoint_a=adjoint_a, adjoint_b=adjoint_b)
  if rank == 2:
    return _op(graph, "MatMul", [a, b], a.dtype,
               {"T": _type_attr(a.dtype), "transpose_a": _bool_attr(adjoint_a),
                "transpose_b": _bool_attr(adjoint_b)})
  return _op(graph, "BatchMatMulV2", [a, b], a.dtype,
             {"T": _type_attr(a.dtype), "adj_x": _bool_attr(adjoint_a),
              "adj_y": _bool_attr(adjoint_b)})


def _plain_variable(graph, v):
  """Whether reads and writes of v may be made directly in graph: a plain resource
  variable used from a tf.function's graph that captures it by reference."""
  if graph is None:  # graph_for's answer: None where the speed layer is off
    return False
  return (type(v) is speed_layer.internals().ResourceVariable and  # pylint: disable=unidiomatic-typecheck
          hasattr(graph, "watch_variable") and not getattr(graph, "capture_by_value", False)
          and getattr(v, "_cached_value", None) is None and
          getattr(v, "_caching_device", None) is None and
          getattr(v, "_xla_sharding", None) is None)


def read_variable(v):
  """v.value(): a ReadVariableOp of tf.Variable v."""
  graph = graph_for()
  if not _plain_variable(graph, v):
    return v.value()
  graph.watch_variable(v)  # as the read does: the function's variables include v
  # As value() does, outside the caller's device and colocation scopes.
  with graph.colocate_with(None, ignore_existing=True):
    return _op(graph, "ReadVariableOp", [v.handle], v.dtype,
               {"dtype": _type_attr(v.dtype)})


_WRITES = {"assign": "AssignVariableOp", "assign_add": "AssignAddVariableOp",
           "assign_sub": "AssignSubVariableOp"}


def write_variable(method, v, value):
  """getattr(v, method)(value) for method "assign", "assign_add" or "assign_sub" of
  tf.Variable v; directly made, it returns the write's tf.Operation."""
  graph = graph_for(value)
  if (not _plain_variable(graph, v) or value.dtype != v.dtype or
      not v.shape.is_compatible_with(value.shape)):
    return getattr(v, method)(value)
  attrs = {"dtype": _type_attr(v.dtype)}
  if method == "assign":  # the runtime shape check the API asks for
    attrs["validate_shape"] = _bool_attr(
        bool(getattr(v, "_validate_shape", True)) and v.shape.is_fully_defined())
  return _make(graph, _WRITES[method], [v.handle, value], [], attrs)
