"""Slice-wise ops: a TF function applied independently to each processor's slices.

`SlicewiseOperation` is the workhorse behind elementwise math. Dims the function needs
whole (not in `splittable_dims`) are gathered before it runs and cut back to the layout
after, so every layout gives the same numbers.
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.lowering import direct_ops, plan_interpreter
from mesh_tf.plans import rules as plan_rules
from mesh_tf.shapes import Shape, convert_to_shape


def local_broadcast(t, in_shape, out_shape, full_rank=True):
  """Transposes/expands a slice of `in_shape` so it broadcasts against `out_shape` slices:
  missing dims become size-1 axes, except leading ones with full_rank=False (TF's
  broadcasting adds them)."""
  in_names = in_shape.dimension_names
  out_names = out_shape.dimension_names
  extra = [n for n in in_names if n not in out_names]
  if extra:
    raise ShapeError("cannot broadcast %s to %s: dims %s are not in the target"
                     % (in_shape, out_shape, extra))
  perm = [in_names.index(n) for n in out_names if n in in_names]
  if perm != list(range(len(perm))):
    t = direct_ops.transpose(t, perm)
  first = 0
  if not full_rank:
    while first < len(out_names) and out_names[first] not in in_names:
      first += 1
  missing = [a for a in range(first, len(out_names)) if out_names[a] not in in_names]
  if not missing:
    return t
  if t.shape.is_fully_defined():
    sizes = iter(t.shape.as_list())
    return direct_ops.reshape(t, [next(sizes) if n in in_names else 1
                                  for n in out_names[first:]])
  for axis in missing:
    t = tf.expand_dims(t, axis - first)
  return t


class SlicewiseOperation(Operation):
  """Applies tf_fn (per-slice tf.Tensors -> a tf.Tensor, or a tuple of them when
  output_shapes is a list of Shapes) to the slices of the inputs.

  splittable_dims: names of dims tf_fn may see partially (None: all); others are gathered
  whole. grad_function: fn(op, grad_ys) -> input gradients, or None for no gradient.
  """

  def __init__(self, tf_fn, inputs, output_shapes, output_dtypes, splittable_dims=None,
               grad_function=None, name=None):
    super().__init__(inputs, name=name or "slicewise")
    self._tf_fn = tf_fn
    self._grad_function = grad_function
    # Several outputs come as a list of Shapes (one shape may be a list of Dimensions).
    self._multi = isinstance(output_shapes, (list, tuple)) and any(
        isinstance(s, Shape) for s in output_shapes)
    shapes = list(output_shapes) if self._multi else [output_shapes]
    dtypes = list(output_dtypes) if isinstance(output_dtypes, (list, tuple)) else (
        [output_dtypes] * len(shapes))
    for s, d in zip(shapes, dtypes):
      self._add_output(convert_to_shape(s), d)
    self._splittable = None if splittable_dims is None else frozenset(
        d if isinstance(d, str) else d.name for d in splittable_dims)
    if self._splittable is not None:
      # As declared: the named dims are splittable, every other dim is not.
      self._splittable_dims, self._unsplittable_dims = (
          self._initialize_splittable_and_unsplittable_dims("unsplittable",
                                                            self._splittable))

  def _gathered_dim_names(self):
    """Names of the dims the lowering gathers whole before running tf_fn on slices."""
    return self.unsplittable_dims

  @property
  def has_gradient(self):
    return self._grad_function is not None and super().has_gradient

  def gradient(self, grad_ys):
    return self._grad_function(self, grad_ys)

  def plan(self, layout):
    """The OpPlan on a MeshLayout: gather the unsplittable dims, cut them after."""
    return plan_rules.whole_dims_plan(layout, [x.shape for x in self.inputs],
                                      [y.shape for y in self.outputs],
                                      self._gathered_dim_names())

  def lower(self, lowering):
    plan = self.plan(lowering.mesh_impl(self).slice_layout)
    plan_interpreter.lower_planned(lowering, self, plan, self._tf_fn)


def slicewise(tf_fn, xs, output_shape=None, output_dtype=None, splittable_dims=None,
              grad_function=None, name=None):
  """Runs tf_fn on slices of xs; returns one mtf Tensor, or a tuple for several outputs
  (output_shape/output_dtype default to those of xs[0])."""
  xs = list(xs)
  op = SlicewiseOperation(
      tf_fn, xs, output_shape if output_shape is not None else xs[0].shape,
      output_dtype or xs[0].dtype, splittable_dims=splittable_dims,
      grad_function=grad_function, name=name)
  return tuple(op.outputs) if len(op.outputs) > 1 else op.outputs[0]


def _check_same_shape(xs, what):
  for x in xs[1:]:
    if x.shape != xs[0].shape:
      raise ShapeError("%s needs inputs of one shape: %s is %s but %s is %s"
                       % (what, xs[0].name, xs[0].shape, x.name, x.shape))


def cwise(tf_fn, xs, output_dtype=None, grad_function=None, name=None):
  """Elementwise op on inputs of identical shape."""
  xs = list(xs)
  _check_same_shape(xs, name or "cwise")
  return slicewise(tf_fn, xs, output_dtype=output_dtype, grad_function=grad_function,
                   name=name)


class GenericGradOperation(SlicewiseOperation):
  """Gradient of a SlicewiseOperation computed by TF autodiff on each slice."""

  def __init__(self, forward_op, grad_ys, name=None):
    self._forward = forward_op
    n_in = len(forward_op.inputs)
    present = [g is not None for g in grad_ys]
    dys = [g for g in grad_ys if g is not None]

    def grad_fn(*slices):
      xs, dy_slices = list(slices[:n_in]), list(slices[n_in:])
      with tf.GradientTape() as tape:
        for x in xs:
          tape.watch(x)
        ys = forward_op._tf_fn(*xs)  # pylint: disable=protected-access
        ys = list(ys) if isinstance(ys, (tuple, list)) else [ys]
      ys = [y for y, p in zip(ys, present) if p]
      grads = tape.gradient(ys, xs, output_gradients=dy_slices,
                            unconnected_gradients=tf.UnconnectedGradients.ZERO)
      return tuple(grads)

    super().__init__(
        grad_fn, list(forward_op.inputs) + dys,
        [x.shape for x in forward_op.inputs], [x.dtype for x in forward_op.inputs],
        splittable_dims=forward_op._splittable,  # pylint: disable=protected-access
        name=name or forward_op.name + "/grad")
    # Declares every dim splittable (the forward op's declaration already constrains the
    # layout); the lowering still gathers the forward's whole dims (_gathered_dim_names).
    tensors = list(forward_op.inputs) + list(forward_op.outputs) + dys
    self._splittable_dims = frozenset(n for t in tensors for n in t.shape.dimension_names)
    self._unsplittable_dims = frozenset()

  def _gathered_dim_names(self):
    return self._forward._gathered_dim_names()  # pylint: disable=protected-access


def generic_gradient(op, grad_ys):
  """A grad_function for slicewise ops: differentiate tf_fn slice by slice."""
  grads = GenericGradOperation(op, grad_ys).outputs
  return [g if x.dtype.is_floating else None for g, x in zip(grads, op.inputs)]
