"""User-defined backward passes: `custom_gradient`, and `recompute_grad` built on it.

`recompute_grad` rebuilds fn's forward ops in the backward pass (`clone_operations`), so
activations need not be kept between the passes.
"""
import copy

import tensorflow as tf

from mesh_tf.autodiff.gradients import gradients
from mesh_tf.errors import MtfError, ShapeError
from mesh_tf.graph import Operation, Tensor
from mesh_tf.ops.variables import Variable


def clone_operations(graph, operations, input_mapping):
  """Re-creates operations (in order), reading input_mapping's replacements of tensors;
  returns {old tensor: new tensor}. Ops without inputs (variables, random ops, constants)
  are not copied: their outputs map to themselves."""
  mapping = dict(input_mapping)
  for op in operations:
    if not op.inputs:
      for y in op.outputs:
        mapping.setdefault(y, y)
      continue
    clone = copy.copy(op)
    # pylint: disable=protected-access
    clone._inputs = [mapping.get(x, x) for x in op.inputs]
    clone._name = graph.unique_name(op.name)
    clone._outputs = []
    for y in op.outputs:
      mapping[y] = clone._add_output(y.shape, y.dtype)
    graph.add_operation(clone)
  return mapping


class CustomGradientOperation(Operation):
  """Passes fn's outputs through; its gradient is grad_fn's (see custom_gradient), and
  none reaches the forward ops. Inputs: all_inputs, then fn's outputs."""

  def __init__(self, explicit_inputs, all_inputs, fn_outputs, grad_fn, forward_operations,
               name=None):
    super().__init__(list(all_inputs) + list(fn_outputs), name=name or "custom_gradient")
    self._explicit_inputs = list(explicit_inputs)
    self._num_all_inputs = len(all_inputs)
    self._grad_fn = grad_fn
    self._forward_operations = list(forward_operations)
    for y in fn_outputs:
      self._add_output(y.shape, y.dtype)

  @property
  def all_inputs(self):
    """The explicit inputs, then the other tensors fn read."""
    return self.inputs[:self._num_all_inputs]

  @property
  def fn_outputs(self):
    """fn's own outputs (this op's outputs pass them through)."""
    return self.inputs[self._num_all_inputs:]

  def lower(self, lowering):
    for src, y in zip(self.fn_outputs, self.outputs):
      lowering.set_tensor_lowering(y, lowering.tensors[src])

  def gradient(self, grad_ys):
    graph = self.graph
    num_vars = len(graph.all_variables)
    grads = list(self._grad_fn(
        explicit_inputs=self._explicit_inputs, all_inputs=self.all_inputs,
        forward_operations=self._forward_operations, outputs=self.fn_outputs,
        output_grads=grad_ys))
    if len(graph.all_variables) != num_vars:
      raise MtfError("custom_gradient %r: grad_fn created variables %s; create them in "
                     "the forward function instead" % (self.name, [
                         v.name for v in graph.all_variables[num_vars:]]), op=self.name)
    if len(grads) != self._num_all_inputs:
      raise ShapeError("custom_gradient %r: grad_fn returned %d gradients for %d inputs "
                       "(explicit inputs, then %s)" % (
                           self.name, len(grads), self._num_all_inputs,
                           [t.name for t in self.all_inputs[len(self._explicit_inputs):]]),
                       op=self.name)
    return grads + [None] * len(self.fn_outputs)


def custom_gradient(fn, grad_fn, explicit_inputs):
  """fn(*explicit_inputs) (a Tensor or a tuple of them), differentiated by grad_fn.

  grad_fn(explicit_inputs, all_inputs, forward_operations, outputs, output_grads) returns
  one gradient (or None) per tensor of all_inputs: the explicit inputs, then every other
  tensor fn's ops read (e.g. variable values, including variables fn creates), in
  first-use order. output_grads has one entry (maybe None) per output.
  """
  explicit_inputs = list(explicit_inputs)
  if not explicit_inputs or not all(isinstance(x, Tensor) for x in explicit_inputs):
    raise ShapeError("custom_gradient needs a non-empty list of mtf Tensors as "
                     "explicit_inputs, got %r" % (explicit_inputs,))
  graph = explicit_inputs[0].graph
  outputs, forward_ops = graph.capture_operations(lambda: fn(*explicit_inputs))
  returns_tuple = isinstance(outputs, tuple)
  outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
  # Variables created inside fn count as inputs too: their gradients must get out.
  made_inside = {y for op in forward_ops if not isinstance(op, Variable)
                 for y in op.outputs}
  outside = made_inside | set(explicit_inputs)
  implicit = [t for t in dict.fromkeys(t for op in forward_ops for t in op.inputs)
              if t not in outside]
  op = CustomGradientOperation(explicit_inputs, explicit_inputs + implicit, outputs,
                               grad_fn, forward_ops)
  return tuple(op.outputs) if returns_tuple else op.outputs[0]


def _compiled_by_xla(impl):
  """Whether impl's program is compiled by XLA (GSPMD, or SIMD on real TPU cores)."""
  return impl.needs_xla or getattr(impl, "is_emulated", True) is False


class RecomputeInput(Operation):
  """x again, as a new value that exists only once the tensors in `ready` do, so that
  `recompute_grad`'s recomputation runs in the backward pass, unmerged with the forward.

  Outside XLA a control dependency on `ready` does it. XLA drops those and merges equal
  computations, so there the copy is x + 0 * sum(first ready tensor) behind an
  optimization barrier: a value the forward pass lacks, waiting for the gradient."""

  def __init__(self, x, ready, name=None):
    super().__init__([x] + list(ready), name=name or "recompute_input")
    self._add_output(x.shape, x.dtype)

  def gradient(self, grad_ys):
    return list(grad_ys) + [None] * (len(self.inputs) - 1)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = lowering.tensors[self.inputs[0]]
    if tf.executing_eagerly():  # eager ops run in order; there is nothing to merge
      lowering.set_tensor_lowering(self.outputs[0], x)
      return
    ready = [t for y in self.inputs[1:] for t in impl.control_tensors(lowering.tensors[y])]
    if _compiled_by_xla(impl):
      from tensorflow.compiler.tf2xla.ops import gen_xla_ops  # pylint: disable=g-import-not-at-top

      def fn(t):
        t, first_ready = gen_xla_ops.xla_optimization_barrier([t] + ready)[:2]
        if not t.dtype.is_floating:
          return t
        # XLA's CPU pipeline drops barriers before its last CSE pass; it does not fold
        # 0 * y for floats (y may be NaN), so this sum keeps t apart from the forward's.
        zero = tf.cast(tf.reduce_sum(first_ready), t.dtype) * tf.constant(0, t.dtype)
        return t + zero
    else:
      def fn(t):
        with tf.control_dependencies(ready):
          return tf.identity(t)
    lowering.set_tensor_lowering(self.outputs[0], impl.slicewise(fn, x))


def recompute_grad(fn, explicit_inputs, control_dependencies=True):
  """fn(*explicit_inputs), whose forward ops are recomputed in the backward pass.

  The gradient equals fn's ordinary gradient (random ops and variables are shared, not
  re-drawn). With control_dependencies, the recomputation waits for the output
  gradients, so it runs late in the backward pass (see RecomputeInput).
  """
  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs, output_grads):
    del explicit_inputs
    graph = all_inputs[0].graph
    ready = [g for g in output_grads if g is not None]
    sources = [RecomputeInput(x, ready).outputs[0] if control_dependencies and ready
               else x for x in all_inputs]
    mapping, recompute_ops = graph.capture_operations(lambda: clone_operations(
        graph, forward_operations, dict(zip(all_inputs, sources))))
    live = [(mapping.get(y, y), g) for y, g in zip(outputs, output_grads) if g is not None]
    if not live:
      return [None] * len(all_inputs)
    return gradients([y for y, _ in live], sources, grad_ys=[g for _, g in live],
                     operations=recompute_ops)
  return custom_gradient(fn, grad_fn, explicit_inputs)
