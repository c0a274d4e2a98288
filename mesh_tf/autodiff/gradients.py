"""Reverse-mode autodiff over the mtf graph.

Each op supplies its gradient as mtf ops, so gradients are laid out and lowered like any
other part of the graph (and split the same way as the forward pass).
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation


def _add_all(grads):
  from mesh_tf.ops.elementwise import add_n  # pylint: disable=g-import-not-at-top
  return grads[0] if len(grads) == 1 else add_n(grads)


def gradients(ys, xs, grad_ys=None, operations=None):
  """d(sum of ys)/d(each of xs), as mtf Tensors (None where x does not affect ys).

  Args:
    ys: list of mtf Tensors (usually one scalar loss).
    xs: list of mtf Tensors (e.g. variable values from get_variable).
    grad_ys: optional upstream gradients, one per y (default: ones).
    operations: the ops to differentiate through (default: the whole graph).
  """
  from mesh_tf.ops.elementwise import ones_like  # pylint: disable=g-import-not-at-top
  ys, xs = list(ys), list(xs)
  if not ys:
    raise ShapeError("gradients needs at least one y")
  graph = ys[0].graph
  ops = list(graph.operations if operations is None else operations)
  if grad_ys is None:
    grad_ys = [None] * len(ys)
  # Tensors that depend on some x: only these need gradients.
  downstream = set(xs)
  for op in ops:
    if any(t in downstream for t in op.inputs):
      downstream.update(op.outputs)
  pending = {}
  for y, gy in zip(ys, grad_ys):
    if gy is not None and gy.shape != y.shape:
      raise ShapeError("grad_ys for %s has shape %s, expected %s" % (y.name, gy.shape,
                                                                       y.shape))
    pending.setdefault(y, []).append(gy if gy is not None else ones_like(y))
  for op in reversed(ops):
    out_grads = [_add_all(pending[t]) if t in pending else None for t in op.outputs]
    if (all(g is None for g in out_grads) or not op.has_gradient or
        not any(t in downstream for t in op.inputs)):
      continue
    in_grads = op.gradient(out_grads)
    for t, g in zip(op.inputs, in_grads):
      if g is not None and t in downstream:
        if g.shape != t.shape:
          raise ShapeError("gradient of op %s for input %s has shape %s, expected %s"
                           % (op.name, t.name, g.shape, t.shape), op=op.name)
        pending.setdefault(t, []).append(g)
  return [_add_all(pending[x]) if x in pending else None for x in xs]


class StopGradient(Operation):
  """Identity in the forward pass; no gradient flows through it."""

  def __init__(self, x, name=None):
    super().__init__([x], name=name or "stop_gradient")
    self._add_output(x.shape, x.dtype)

  @property
  def has_gradient(self):
    return False

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    lowering.set_tensor_lowering(self.outputs[0], impl.slicewise(
        tf.stop_gradient, lowering.tensors[self.inputs[0]]))


def stop_gradient(x):
  """x, with no gradient flowing back through it."""
  return StopGradient(x).outputs[0]
