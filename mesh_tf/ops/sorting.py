"""Order statistics along one named dim: top_k, sort, nth_largest/smallest_element.

`top_k` works when its dim is split: each processor takes the top k of its own slice, and
a second top k over the gathered candidates (with global indices) picks the winners.
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.lowering import plan_interpreter
from mesh_tf.ops.einsum import einsum
from mesh_tf.ops.indexing import one_hot
from mesh_tf.ops.reduce import reduce_sum
from mesh_tf.ops.slicewise import generic_gradient, slicewise
from mesh_tf.ops.slicing import slice as mtf_slice
from mesh_tf.plans import rules as plan_rules
from mesh_tf.shapes import Dimension, convert_to_dimension


def _checked_dim(x, dim, fn_name):
  """The Dimension of x named like dim (a Dimension, pair or name), else a ShapeError."""
  name = dim if isinstance(dim, str) else convert_to_dimension(dim).name
  for d in x.shape.dims:
    if d.name == name:
      if not isinstance(dim, str) and convert_to_dimension(dim) != d:
        raise ShapeError("%s: dim %s does not match %s of %s %s" % (
            fn_name, convert_to_dimension(dim), d, x.name, x.shape), tensor=x.name,
                         dim=name)
      return d
  raise ShapeError("%s: no dim %r in %s %s (dims: %s)" % (
      fn_name, name, x.name, x.shape, x.shape.dimension_names), tensor=x.name, dim=name)


class TopKOperation(Operation):
  """The k largest values of x along reduced_dim and their int32 indices (see top_k).

  Values come in descending order, ties in index order (as tf.math.top_k); the gradient
  flows to the values' positions in x."""

  def __init__(self, x, reduced_dim, k_dim, name=None):
    super().__init__([x], name=name or "top_k")
    self._reduced_dim = _checked_dim(x, reduced_dim, "top_k")
    self._k_dim = convert_to_dimension(k_dim)
    if self._k_dim.name in x.shape.dimension_names:
      raise ShapeError("top_k: k_dim %s is already a dim of %s %s" % (
          self._k_dim, x.name, x.shape), tensor=x.name, dim=self._k_dim.name)
    if not 1 <= self._k_dim.size <= self._reduced_dim.size:
      raise ShapeError("top_k of %s: k_dim %s must have size 1..%d (the size of %s)" % (
          x.name, self._k_dim, self._reduced_dim.size, self._reduced_dim), tensor=x.name,
                       dim=self._k_dim.name)
    if not (x.dtype.is_floating or x.dtype.is_integer):
      raise ShapeError("top_k: %s has dtype %s; it needs numbers" % (x.name, x.dtype.name),
                       tensor=x.name)
    out_shape = x.shape - [self._reduced_dim] + [self._k_dim]
    self._add_output(out_shape, x.dtype)
    self._add_output(out_shape, tf.int32)

  @property
  def unsplittable_dims(self):
    return frozenset([self._k_dim.name])

  def gradient(self, grad_ys):
    dvalues = grad_ys[0]
    if dvalues is None:
      return [None]
    x, indices = self.inputs[0], self.outputs[1]
    positions = one_hot(indices, self._reduced_dim, dtype=dvalues.dtype)
    return [einsum([dvalues, positions], output_shape=x.shape)]

  def plan(self, layout):
    """The OpPlan on a MeshLayout (see plans/rules.top_k_plan)."""
    x = self.inputs[0]
    return plan_rules.top_k_plan(layout, x.shape, self._reduced_dim, self._k_dim,
                                 x.dtype.size)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    axis = x.shape.dims.index(self._reduced_dim)
    ndims = x.shape.ndims
    k = self._k_dim.size
    plan = self.plan(impl.slice_layout)
    local_n = impl.slice_shape(x.shape)[axis]
    perm = [i for i in range(ndims) if i != axis] + [axis]

    def local_top_k(t):
      t = tf.transpose(t, perm) if perm != list(range(ndims)) else t
      return tuple(tf.math.top_k(t, min(k, local_n)))
    values, indices = impl.slicewise(local_top_k, *plan_interpreter.read_operands(
        lowering, self, plan))
    if plan.middle:
      mesh_axis = plan.middle[0].steps[0].mesh_axis
      # Local indices become global ones; the candidates of the whole group then meet.
      indices = impl.slicewise(lambda i, c: i + c * local_n, indices,
                               impl.laid_out_pcoord(mesh_axis))
      values, indices = [plan_interpreter.run_steps(impl, v, m.shape, m.steps)
                         for v, m in zip((values, indices), plan.middle)]

      def global_top_k(v, i):
        v, pos = tf.math.top_k(v, k)
        return v, tf.gather(i, pos, batch_dims=ndims - 1)
      values, indices = impl.slicewise(global_top_k, values, indices)
    plan_interpreter.write_outputs(lowering, self, plan, [values, indices])


def top_k(x, reduced_dim, k_dim, name=None):
  """(values, indices): the k_dim.size largest entries of x along reduced_dim; both have
  x's dims minus reduced_dim, plus k_dim at the end; indices are int32."""
  op = TopKOperation(x, reduced_dim, k_dim, name=name)
  return op.outputs[0], op.outputs[1]


def sort(x, dim, descending=False, name=None):
  """x sorted along dim (which keeps its place), like tf.sort; not in the original.

  Differentiable (the gradient goes back to each value's original position)."""
  d = _checked_dim(x, dim, "sort")
  axis = x.shape.dims.index(d)
  direction = "DESCENDING" if descending else "ASCENDING"
  others = [n for n in x.shape.dimension_names if n != d.name]
  return slicewise(lambda t: tf.sort(t, axis=axis, direction=direction), [x], x.shape,
                   x.dtype, splittable_dims=others, grad_function=generic_gradient,
                   name=name or "sort")


def nth_largest_element(x, n, reduced_dim, name=None):
  """The n-th largest value (n counts from 0) of x along reduced_dim, which is removed."""
  d = _checked_dim(x, reduced_dim, "nth_largest_element")
  if not 0 <= n < d.size:
    raise ShapeError("nth_largest_element: n=%d is outside [0, %d) for dim %s of %s" % (
        n, d.size, d, x.name), tensor=x.name, dim=d.name)
  k_dim = Dimension("_top_k_", n + 1)
  values, _ = top_k(x, d, k_dim, name=name)
  return reduce_sum(mtf_slice(values, n, 1, k_dim.name), reduced_dim=k_dim.name)


def nth_smallest_element(x, n, reduced_dim, name=None):
  """The n-th smallest value (n counts from 0) of x along reduced_dim, which is removed."""
  return -nth_largest_element(-x, n, reduced_dim, name=name)
