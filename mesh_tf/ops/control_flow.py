"""`while_loop`: a tf.while_loop whose condition and body are mtf sub-graphs.

The condition and body are built once, as mtf ops on placeholder tensors kept out of the
graph's operation list; lowering runs tf.while_loop over the laid-out loop variables
(flattened to their `.all_slices`), lowering the sub-graph inside the TF loop body, on
every backend. As in the original library, there is no gradient through a while loop.
"""
import contextlib

import tensorflow as tf

from mesh_tf.errors import MtfError, ShapeError
from mesh_tf.graph import Operation, Tensor


def _as_tensor_list(values, what, op_name):
  values = list(values) if isinstance(values, (list, tuple)) else [values]
  for i, v in enumerate(values):
    if not isinstance(v, Tensor):
      raise ShapeError("while_loop %r: %s %d is %r, not an mtf.Tensor" % (
          op_name, what, i, v), op=op_name)
  return values


def _identity_on(t, device):
  with tf.device(device or None):
    return tf.identity(t)


class WhileLoopOperation(Operation):
  """Repeats body_fn on the loop variables while cond_fn holds (see while_loop).

  Outputs: the final loop vars, then the accumulator sums (zero if the body never ran).
  Inputs: the loop vars, then the outside tensors the condition or body read."""

  def __init__(self, cond_fn, body_fn, inputs, tf_kwargs=None, has_accumulators=False,
               name="while_loop"):
    inputs = _as_tensor_list(inputs, "input", name or "while_loop")
    if not inputs:
      raise ShapeError("while_loop needs at least one loop variable")
    super().__init__(inputs, name=name or "while_loop")
    self._tf_kwargs = dict(tf_kwargs or {})
    self._tf_kwargs.pop("back_prop", None)
    self._has_accumulators = has_accumulators
    self._num_loop_vars = len(inputs)
    graph_ops = self.graph.operations
    graph_ops.remove(self)  # rejoins the graph after the sub-graphs' placeholders
    self._cond_inputs = self._placeholders("cond_input")
    self._cond_output, self._cond_ops = self._capture(lambda: cond_fn(*self._cond_inputs))
    self._check_condition()
    self._body_inputs = self._placeholders("body_input")
    body_outputs, self._body_ops = self._capture(lambda: body_fn(*self._body_inputs))
    self._body_outputs = _as_tensor_list(body_outputs, "body output", self.name)
    self._check_body_outputs()
    graph_ops.append(self)
    # Lowering creates the random ops' counter before any trace if a sub-op draws.
    self.draws_random_steps = any(getattr(op, "draws_random_steps", False)
                                  for op in self._sub_ops())
    self._inputs.extend(self._captured_tensors())
    self.control_inputs = self._captured_control_inputs()
    for y in self._body_outputs:
      self._add_output(y.shape, y.dtype)

  def _placeholders(self, prefix):
    return [Tensor(self, x.shape, x.dtype, name="%s/%s:%d" % (self.name, prefix, i),
                   index=i) for i, x in enumerate(self._inputs[:self._num_loop_vars])]

  def _capture(self, fn):
    graph_ops = self.graph.operations
    start = len(graph_ops)
    try:
      result = fn()
    finally:
      captured = graph_ops[start:]
      del graph_ops[start:]  # even on error: a failed loop leaves no ops behind
    return result, captured

  def _check_condition(self):
    c = self._cond_output
    if not isinstance(c, Tensor) or c.dtype != tf.bool or c.shape.ndims != 0:
      raise ShapeError("while_loop %r: cond_fn must return a scalar bool mtf Tensor, got "
                       "%r" % (self.name, c), op=self.name)

  def _check_body_outputs(self):
    n, outs = self._num_loop_vars, self._body_outputs
    if len(outs) < n or (len(outs) > n and not self._has_accumulators):
      raise ShapeError(
          "while_loop %r: body_fn returned %d tensors for %d loop variables%s" % (
              self.name, len(outs), n,
              "" if self._has_accumulators else " (pass has_accumulators=True to return "
              "accumulators after them)"), op=self.name)
    for i, (x, y) in enumerate(zip(self._inputs[:n], outs)):
      if x.shape != y.shape or x.dtype != y.dtype:
        raise ShapeError(
            "while_loop %r: loop variable %d is %s %s but body_fn returns %s %s for it" % (
                self.name, i, x.shape, x.dtype.name, y.shape, y.dtype.name),
            op=self.name, tensor=y.name)

  def _sub_ops(self):
    return self._cond_ops + self._body_ops

  def _captured_tensors(self):
    """Tensors the sub-graphs read that are made outside them, in first-use order."""
    inside = set(self._sub_ops()) | {self}
    reads = [t for op in self._sub_ops() for t in op.inputs]
    reads += [self._cond_output] + self._body_outputs
    return [t for t in dict.fromkeys(reads) if t.operation not in inside]

  def _body_numbers_its_draws(self):
    """Whether the body draws random values and only its own RandomOperations do (the
    condition and any nested while loop draw nothing)."""
    def draws(op):
      return getattr(op, "draws_random_steps", False)
    return (any(draws(op) for op in self._body_ops) and
            not any(draws(op) for op in self._cond_ops) and
            not any(draws(op) and isinstance(op, WhileLoopOperation)
                    for op in self._body_ops))

  def _captured_control_inputs(self):
    inside = set(self._sub_ops())
    return [d for op in self._sub_ops() for d in getattr(op, "control_inputs", ())
            if d not in inside]

  @property
  def has_gradient(self):
    return any(x.dtype.is_floating for x in self.inputs)

  def gradient(self, grad_ys):
    raise MtfError(
        "while_loop %r has no gradient (as in the original library): a gradient was "
        "requested through it. Compute gradients inside body_fn (see "
        "serialize_training_step) or stop_gradient its inputs" % self.name, op=self.name)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    n = self._num_loop_vars
    initial = [lowering.tensors[x] for x in self._inputs[:n]]
    for acc in self._body_outputs[n:]:
      sizes, dtype = impl.slice_shape(acc.shape), acc.dtype
      initial.append(impl.slicewise(lambda s=sizes, d=dtype: tf.zeros(s, d)))
    counts = [len(v.all_slices) for v in initial]

    def unflatten(flat):
      out, i = [], 0
      for c in counts:
        out.append(impl.LaidOutTensor(list(flat[i:i + c])))
        i += c
      return out

    def bind(placeholders, values):
      for p, v in zip(placeholders, values):
        lowering.set_tensor_lowering(p, v)

    # Random draws in the body are numbered by an extra loop variable from the counter's
    # value before the loop, and the counter advances once after it: the steps (so the
    # values) the draws would get by advancing it each time, without a variable update
    # in every iteration (a 2x2 sampling step took about 10% longer with it). Not where
    # the condition or a nested loop draws too (they advance the counter themselves,
    # inside the loop), nor in a tf.compat.v1 graph, which does not order the counter's
    # reads and updates as eager execution and tf.function do.
    body_draws = (self._body_numbers_its_draws() and
                  tf.compat.v1.executing_eagerly_outside_functions())
    last_step = impl.last_random_step() if body_draws else None

    def tf_cond(*flat):
      if body_draws:
        flat = flat[:-1]
      bind(self._cond_inputs, unflatten(flat))
      for op in self._cond_ops:
        op.lower(lowering)
      c = self._cond_output
      return impl.export_to_tf_tensor(c, lowering.tensors[c])

    def tf_body(*flat):
      drawn, steps = None, []
      if body_draws:
        flat, drawn = flat[:-1], flat[-1]

      def next_step():
        steps.append(last_step + drawn + (len(steps) + 1))
        return steps[-1]
      values = unflatten(flat)
      bind(self._body_inputs, values)
      with impl.drawing_steps_from(next_step) if body_draws else contextlib.nullcontext():
        for op in self._body_ops:
          op.lower(lowering)
      outs = [lowering.tensors[y] for y in self._body_outputs]
      new = outs[:n] + [impl.slicewise(tf.add, total, out)
                        for total, out in zip(values[n:], outs[n:])]
      flat_out = [t for v in new for t in v.all_slices]
      return flat_out + [drawn + len(steps)] if body_draws else flat_out

    flat = [t for v in initial for t in v.all_slices]
    kwargs = dict(self._tf_kwargs)
    if body_draws:
      flat.append(tf.constant(0, tf.int64))
      if kwargs.get("shape_invariants") is not None:
        kwargs["shape_invariants"] = list(kwargs["shape_invariants"]) + [
            tf.TensorShape([])]
    result = tf.while_loop(tf_cond, tf_body, flat, **kwargs)
    if body_draws:
      # the outputs wait for the counter (a graph run that fetches them advances it),
      # each on its slice's device
      with tf.control_dependencies([impl.advance_random_steps(result[-1])]):
        result = [_identity_on(t, first.device) for t, first in zip(result[:-1], flat)]
    for y, laid in zip(self.outputs, unflatten(result)):
      lowering.set_tensor_lowering(y, laid)


def while_loop(cond_fn, body_fn, inputs, num_loop_vars=None, has_accumulators=False,
               **kwargs):
  """Runs body_fn while cond_fn holds; returns the final loop vars as a list.

  Args:
    cond_fn: fn(*loop vars) -> scalar bool mtf Tensor.
    body_fn: fn(*loop vars) -> list of new loop vars (same shapes and dtypes), then (if
      has_accumulators) tensors summed over the iterations and returned after the loop vars.
    inputs: list of mtf Tensors, the initial loop vars.
    num_loop_vars: if given, only the first num_loop_vars final values (then any
      accumulators) are returned; unlike the original, the other inputs stay loop
      variables rather than becoming variables (the same values).
    **kwargs: passed to tf.while_loop (e.g. maximum_iterations, parallel_iterations).

  There is no gradient through the loop; asking for one raises an MtfError.
  """
  inputs = list(inputs)
  if num_loop_vars is not None and not 0 < num_loop_vars <= len(inputs):
    raise ShapeError("while_loop: num_loop_vars=%r must be in 1..%d (the number of "
                     "inputs)" % (num_loop_vars, len(inputs)))
  op = WhileLoopOperation(cond_fn, body_fn, inputs, tf_kwargs=kwargs,
                          has_accumulators=has_accumulators)
  outputs = list(op.outputs)
  if num_loop_vars is None:
    return outputs
  return outputs[:num_loop_vars] + outputs[len(inputs):]
