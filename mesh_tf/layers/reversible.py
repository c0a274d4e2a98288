"""The RevNet block (Gomez et al. 2017, arXiv 1707.04585): a half residual and a swap.

A block maps (x1, x2) to (x2, x1 + f(x2)). Its inputs can be rebuilt from its outputs
(x2 is an output; x1 = y - f(x2)), so the backward pass need not keep activations: each
block has "backwards" companions of its outputs whose *gradients* carry the rebuilt
activations from the block after it to the block before it.
"""
from mesh_tf.autodiff.gradients import gradients
from mesh_tf.errors import ShapeError
from mesh_tf.ops.custom_gradient import clone_operations, custom_gradient


def _check_like(t, reference, what):
  """Raises a ShapeError unless t has reference's shape and dtype."""
  if t.shape != reference.shape or t.dtype != reference.dtype:
    mismatched = [d.name for d in t.shape.dims if d not in reference.shape.dims]
    mismatched += [d.name for d in reference.shape.dims if d not in t.shape.dims]
    raise ShapeError("reversible_half_residual_and_swap: %s %s (%s) must have the shape and "
                     "dtype of %s %s (%s)" % (
                         what, t.shape, t.dtype.name, reference.name, reference.shape,
                         reference.dtype.name), tensor=t.name,
                     dim=mismatched[0] if mismatched else None)


def _sum(a, b):
  if a is None or b is None:
    return b if a is None else a
  return a + b


def reversible_half_residual_and_swap(x1, x1_backwards, x2, x2_backwards, f,
                                      recompute_grads=True):
  """One RevNet block: returns (x2, x2_backwards', x1 + f(x2), y_backwards').

  Chain blocks by passing each block's four outputs as the next block's four inputs
  (None for the backwards tensors of the first block). All tensors share one shape and
  dtype; f maps a Tensor to one of its shape and may create variables and use randomness
  (the recomputation reuses both).

  With recompute_grads, the backwards outputs equal their forward counterparts, and in
  the backward pass the gradient this block sends to x1_backwards / x2_backwards is the
  rebuilt value of x1 / x2 (not a derivative), f recomputed on the rebuilt x2. Gradients
  of x1, x2 and f's variables equal those of the plain computation. Without
  recompute_grads the block is the plain computation and the backwards outputs are None.
  """
  _check_like(x2, x1, "x2")
  for t, ref, what in ((x1_backwards, x1, "x1_backwards"),
                       (x2_backwards, x2, "x2_backwards")):
    if t is not None:
      _check_like(t, ref, what)

  def residual(a1, a2):
    fx, f_ops = a2.graph.capture_operations(lambda: f(a2))
    _check_like(fx, a2, "f(x2)")
    return a1 + fx, fx, f_ops

  if not recompute_grads:
    return x2, None, residual(x1, x2)[0], None
  backwards = [t for t in (x1_backwards, x2_backwards) if t is not None]
  has_x1_backwards = x1_backwards is not None
  saved = {}

  def forward(a1, a2, *unused_backwards):
    y, saved["fx"], saved["f_ops"] = residual(a1, a2)
    return a2, a2, y, y

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs, output_grads):
    del forward_operations
    graph = x1.graph
    implicit = all_inputs[len(explicit_inputs):]
    d_x2_out, rebuilt_x2, d_y, rebuilt_y = output_grads
    rebuilt_x2 = outputs[1] if rebuilt_x2 is None else rebuilt_x2
    rebuilt_y = outputs[3] if rebuilt_y is None else rebuilt_y
    mapping, f_again_ops = graph.capture_operations(lambda: clone_operations(
        graph, saved["f_ops"], {x2: rebuilt_x2}))
    fx_again = mapping.get(saved["fx"], saved["fx"])
    rebuilt_x1 = rebuilt_y - fx_again
    f_grads = [None] * (1 + len(implicit))
    if d_y is not None:
      f_grads = gradients([fx_again], [rebuilt_x2] + list(implicit), grad_ys=[d_y],
                          operations=f_again_ops)
    grads = [d_y, _sum(d_x2_out, f_grads[0])]
    if has_x1_backwards:
      grads.append(rebuilt_x1)
    if x2_backwards is not None:
      grads.append(rebuilt_x2)
    return grads + list(f_grads[1:])

  return custom_gradient(forward, grad_fn, [x1, x2] + backwards)
