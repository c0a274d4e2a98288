"""Runs an op's plan (mesh_tf/plans) on laid-out values with the MeshImpl's primitives.

An op's lower() is: `read_operands`, the local TF computation (`impl.slicewise`), then
`write_outputs` -- nothing else sends data. A backend may run steps its own way by
overriding `MeshImpl.run_step`.
"""
from mesh_tf.lowering.lazy_allreduce import LazyAllreduceSum
from mesh_tf.plans import steps as plan_steps


def run_steps(impl, laid_out, shape, steps):
  """laid_out (a value of mtf shape `shape`) after the steps; an owed Allreduce returns a
  LazyAllreduceSum."""
  for step in steps:
    if getattr(step, "owed", False):
      laid_out = LazyAllreduceSum(impl, laid_out, step.mesh_axes,
                                  op_name=impl.current_op_name)
    else:
      laid_out = impl.run_step(step, laid_out, shape)
  return laid_out


def owed_axes(lowering, x):
  """Mesh axes of the SUM the lowered value of x still owes, or None."""
  raw = lowering.tensors.raw(x)
  return raw.mesh_axes if isinstance(raw, LazyAllreduceSum) else None


def read_operands(lowering, op, plan):
  """The laid-out values op's local computation reads, per plan.operands."""
  impl = lowering.mesh_impl(op)
  out = []
  for operand in plan.operands:
    x = op.inputs[operand.input]
    value = (lowering.tensors.raw(x).laid_out if plan.reads_partial_sums
             else lowering.tensors[x])
    out.append(run_steps(impl, value, x.shape, operand.steps))
  return out


def local_output_shape(lowering, op, plan, index=0):
  """Slice shape (list of ints) of output `index` as the local computation makes it."""
  y = op.outputs[index]
  layout = lowering.mesh_impl(op).slice_layout
  return plan_steps.local_shape(
      layout, y.shape, plan_steps.output_start(layout, y.shape, plan.outputs[index]))


def write_outputs(lowering, op, plan, values):
  """Runs each output's steps on its local result and records it as op's output."""
  impl = lowering.mesh_impl(op)
  for y, value, out_steps in zip(op.outputs, values, plan.outputs):
    lowering.set_tensor_lowering(y, run_steps(impl, value, y.shape, out_steps))


def lower_planned(lowering, op, plan, fn, extra=()):
  """The whole lower() of a plain planned op: operands, fn slice by slice (extra laid-out
  values appended), outputs. Returns the local results."""
  impl = lowering.mesh_impl(op)
  out = impl.slicewise(fn, *(read_operands(lowering, op, plan) + list(extra)))
  values = list(out) if isinstance(out, (tuple, list)) else [out]
  write_outputs(lowering, op, plan, values)
  return values
