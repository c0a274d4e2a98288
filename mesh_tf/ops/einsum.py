"""Einsum by dimension name: a local einsum on slices, then a SUM allreduce over the mesh
axes that split a contracted dimension (deferred: see lowering/lazy_allreduce.py)."""
import collections
import string

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation, Tensor
from mesh_tf.lowering import plan_interpreter
from mesh_tf.plans import rules as plan_rules
from mesh_tf.shapes import Shape, convert_to_shape, list_product, shape_union


def _equation(input_shapes, output_shape):
  names = []
  for s in list(input_shapes) + [output_shape]:
    for n in s.dimension_names:
      if n not in names:
        names.append(n)
  if len(names) > len(string.ascii_letters):
    raise ShapeError("einsum over %d distinct dims is more than TF supports" % len(names))
  letter = dict(zip(names, string.ascii_letters))
  spec = lambda s: "".join(letter[n] for n in s.dimension_names)
  return ",".join(spec(s) for s in input_shapes) + "->" + spec(output_shape)


class EinsumOperation(Operation):
  """Contracts inputs to output_shape; dims missing from the output are summed over."""

  def __init__(self, inputs, output_shape, name=None):
    super().__init__(inputs, name=name or "einsum")
    output_shape = convert_to_shape(output_shape)
    shape_union([x.shape for x in inputs] + [output_shape])  # raises on a size clash
    for d in output_shape.dims:
      if not any(d in x.shape.dims for x in inputs):
        raise ShapeError(
            "einsum %r: output dim %s is found in no input (inputs: %s); add it to an input "
            "or broadcast afterwards" % (self.name, d, ", ".join(
                "%s %s" % (x.name, x.shape) for x in inputs)), op=self.name, dim=d.name)
    for x in inputs[1:]:
      if x.dtype != inputs[0].dtype:
        raise ShapeError("einsum %r: dtype mismatch between %s (%s) and %s (%s)" % (
            self.name, inputs[0].name, inputs[0].dtype.name, x.name, x.dtype.name),
                         op=self.name, tensor=x.name)
    self._add_output(output_shape, inputs[0].dtype)

  def gradient(self, grad_ys):
    from mesh_tf.ops.reshape import broadcast  # pylint: disable=g-import-not-at-top
    dy = grad_ys[0]
    grads = []
    for i, x in enumerate(self.inputs):
      others = [dy] + self.inputs[:i] + self.inputs[i + 1:]
      available = shape_union([t.shape for t in others])
      target = Shape([d for d in x.shape.dims if d in available.dims])
      g = einsum(others, output_shape=target)
      grads.append(broadcast(g, x.shape) if target != x.shape else g)
    return grads

  def plan(self, layout):
    """The OpPlan of this einsum on a MeshLayout (see plans/rules.py)."""
    return plan_rules.einsum_plan(layout, [x.shape for x in self.inputs],
                                  self.outputs[0].shape)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    equation = _equation([x.shape for x in self.inputs], self.outputs[0].shape)
    plan = self.plan(impl.slice_layout)
    for operand in plan.operands:
      if operand.steps:
        lowering.add_counter("einsum_allconcat",
                             impl.laid_out_size(self.inputs[operand.input].shape))
    plan_interpreter.lower_planned(lowering, self, plan,
                                   lambda *slices: impl.einsum(equation, *slices))
    all_dims = shape_union([x.shape for x in self.inputs])
    lowering.add_counter("einsum", list_product(all_dims.to_integer_list))


def _infer_output_shape(xs, output_shape, reduced_dims):
  all_dims = shape_union([x.shape for x in xs])
  if reduced_dims is not None:
    reduced = convert_to_shape(reduced_dims) if not isinstance(reduced_dims, Shape) else (
        reduced_dims)
    for d in reduced.dims:
      if d not in all_dims.dims:
        raise ShapeError("einsum: reduced dim %s is in no input (dims: %s)"
                         % (d, all_dims), dim=d.name)
    inferred = all_dims - reduced.dims
    if output_shape is not None:
      output_shape = convert_to_shape(output_shape)
      if set(output_shape.dims) != set(inferred.dims):
        raise ShapeError("einsum: output_shape %s disagrees with reduced_dims %s (inputs %s)"
                         % (output_shape, reduced, all_dims))
      return output_shape
    return inferred
  if output_shape is not None:
    return convert_to_shape(output_shape)
  counts = collections.Counter(d for x in xs for d in x.shape.dims)
  return Shape([d for d in all_dims.dims if counts[d] == 1])


def einsum(xs, output_shape=None, reduced_dims=None, name=None):
  """Einstein summation matching dims by name. Without output_shape, the output keeps
  the dims not in reduced_dims, or (without either) those found in exactly one input."""
  xs = list(xs)
  if not xs:
    raise ShapeError("einsum needs at least one input")
  for i, x in enumerate(xs):
    if not isinstance(x, Tensor):
      raise ShapeError("einsum input %d is %r, not an mtf.Tensor; import TF values with "
                       "mtf.import_tf_tensor" % (i, type(x).__name__))
  out = _infer_output_shape(xs, output_shape, reduced_dims)
  return EinsumOperation(xs, out, name=name).outputs[0]


def matmul(a, b, output_shape=None, reduced_dims=None, name=None):
  """Two-input einsum."""
  return einsum([a, b], output_shape=output_shape, reduced_dims=reduced_dims, name=name)
