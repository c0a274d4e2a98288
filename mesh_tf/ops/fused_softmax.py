"""softmax, log_softmax and logsumexp over one named dim as one op each, lowered to TF's
fused kernels (tf.nn.softmax, tf.nn.log_softmax, tf.reduce_logsumexp) where the dim is
whole on every processor. Where a mesh axis splits it, the local max and the local sum of
exp(x - max) are allreduced in turn: the communication of the composite of reductions."""
import tensorflow as tf

from mesh_tf.graph import Operation
from mesh_tf.lowering import plan_interpreter
from mesh_tf.ops import elementwise as ew
from mesh_tf.plans import rules as plan_rules

KINDS = ("softmax", "log_softmax", "logsumexp")


def _softmax_kernel(kernel):
  """kernel (tf.nn.softmax or log_softmax) over `axis` of t of any rank: the CPU kernels
  take at most rank 5, so higher ranks go through [rows, axis] and back."""
  def fn(t, axis):
    rank = t.shape.rank
    if rank <= 5:
      return kernel(t, axis)
    perm = [i for i in range(rank) if i != axis] + [axis]
    moved = tf.transpose(t, perm) if axis != rank - 1 else t
    shape = moved.shape.as_list()
    out = tf.reshape(kernel(tf.reshape(moved, [-1, shape[-1]])), shape)
    return tf.transpose(out, [perm.index(i) for i in range(rank)]) if moved is not t else out
  return fn


# tf.nn.softmax over one axis of a slice of any rank (also the fused attention's)
local_softmax = _softmax_kernel(tf.nn.softmax)
_FUSED = {"softmax": local_softmax,
          "log_softmax": _softmax_kernel(tf.nn.log_softmax),
          "logsumexp": tf.reduce_logsumexp}


class FusedSoftmaxOperation(Operation):
  """`kind` (softmax, log_softmax or logsumexp) of x over reduced_dim (a dim of x)."""

  def __init__(self, x, reduced_dim, kind, name=None):
    super().__init__([x], name=name or kind)
    if kind not in KINDS:
      raise ValueError("unknown fused softmax kind %r; use one of %s" % (kind, KINDS))
    self.kind = kind
    self.reduced_dim = reduced_dim
    self._add_output(x.shape - [reduced_dim] if kind == "logsumexp" else x.shape, x.dtype)

  def gradient(self, grad_ys):
    from mesh_tf.ops.reduce import reduce_sum  # pylint: disable=g-import-not-at-top
    x, y, dy = self.inputs[0], self.outputs[0], grad_ys[0]
    d = self.reduced_dim
    if self.kind == "logsumexp":
      return [ew.exp(x - y) * dy]
    if self.kind == "log_softmax":
      return [dy - ew.exp(y) * reduce_sum(dy, reduced_dim=d)]
    return [y * (dy - reduce_sum(dy * y, reduced_dim=d))]

  def plan(self, layout):
    """The OpPlan on a MeshLayout (see plans/rules.softmax_plan)."""
    x = self.inputs[0]
    return plan_rules.softmax_plan(layout, x.shape, self.reduced_dim, x.dtype.size)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    axis = self.inputs[0].shape.dims.index(self.reduced_dim)
    plan = self.plan(impl.slice_layout)
    if not plan.middle:
      fused = _FUSED[self.kind]
      plan_interpreter.lower_planned(lowering, self, plan, lambda t: fused(t, axis))
      return
    x, = plan_interpreter.read_operands(lowering, self, plan)

    def keep(r, t):
      """r (t reduced over axis) with that axis back as 1, by a static reshape."""
      kept = t.shape.as_list()
      kept[axis] = 1
      return tf.reshape(r, kept)
    run = lambda v, m: plan_interpreter.run_steps(impl, v, m.shape, m.steps)
    top = run(impl.slicewise(lambda t: tf.reduce_max(t, axis), x), plan.middle[0])
    # An all -inf (or +inf) slice would give inf - inf = NaN: shift by 0 there instead,
    # as tf.reduce_logsumexp does, so its logsumexp is -inf (+inf).
    top = impl.slicewise(lambda m: tf.where(tf.math.is_finite(m), m, tf.zeros_like(m)), top)
    total = run(impl.slicewise(
        lambda t, m: tf.reduce_sum(tf.exp(t - keep(m, t)), axis), x, top),
                plan.middle[1])
    kind = self.kind

    def finish(t, m, s):
      lse = tf.math.log(s) + m
      if kind == "logsumexp":
        return lse
      shifted = t - keep(lse, t)
      return shifted if kind == "log_softmax" else tf.exp(shifted)
    plan_interpreter.write_outputs(lowering, self, plan,
                                   [impl.slicewise(finish, x, top, total)])


def fused_softmax(x, reduced_dim, kind, name=None):
  """The output of a FusedSoftmaxOperation (see module docstring)."""
  return FusedSoftmaxOperation(x, reduced_dim, kind, name=name).outputs[0]
