"""Pipeline parallelism as a layout: `pipeline` and its static schedule.

The layers' weights carry a `stages` dim; splitting it over a mesh dim puts each stage's
weights on its own processors. A buffer with the same `stages` dim holds one microbatch
per stage. Every iteration moves the buffer one stage on (`shift`, a neighbour exchange
when `stages` is split), puts the next microbatch into stage 0, applies the stage
function to the whole buffer (each stage with its own weights, in one SPMD program) and
takes a finished microbatch from the last stage. The loop is unrolled in the graph, so
`mtf.gradients` of it is the backward pipeline.
"""
import collections

import numpy as np

from mesh_tf.errors import ShapeError
from mesh_tf.graph import variable_scope
from mesh_tf.ops.creation import constant, zeros
from mesh_tf.ops.einsum import einsum
from mesh_tf.ops.reshape import replace_dimensions, reshape, transpose
from mesh_tf.ops.slicing import shift, stack, unstack
from mesh_tf.shapes import Dimension, Shape, convert_to_dimension

# One iteration of a schedule: the microbatch put into stage 0 (or None); {stage:
# (microbatch, repeat)} of the stages holding one; the microbatch the last stage finishes.
Iteration = collections.namedtuple("Iteration", ["enter", "slots", "leave"])


def pipeline_schedule(num_stages, num_microbatches, num_repeats=1):
  """The static schedule of `pipeline`: a list of Iterations.

  Microbatch j enters stage 0 at iteration t0(j) = (j // S) * R * S + j % S (S stages,
  R repeats): microbatches go round the stages in groups of S, a group entering once the
  previous one has left stage 0 for good. Microbatch j is then at stage k % S running
  layer k = r * S + s of repeat r = k // S at iteration t0(j) + k, for k < R * S, and
  leaves the last stage at t0(j) + R * S - 1. So there are t0(M - 1) + R * S iterations:
  M + S - 1 for the plain schedule (R = 1), and M * R + S - 1 for a circular one when S
  divides M. No two microbatches are ever at the same stage in the same iteration.
  """
  s_, m_, r_ = num_stages, num_microbatches, num_repeats
  if min(s_, m_, r_) < 1:
    raise ShapeError("pipeline_schedule: stages %d, microbatches %d and repeats %d must "
                     "all be positive" % (s_, m_, r_))
  layers = s_ * r_
  starts = [(j // s_) * layers + j % s_ for j in range(m_)]
  num_iterations = starts[-1] + layers
  schedule = []
  for t in range(num_iterations):
    slots, enter, leave = {}, None, None
    for j, t0 in enumerate(starts):
      k = t - t0
      if 0 <= k < layers:
        s = k % s_
        assert s not in slots, "schedule puts two microbatches on stage %d" % s
        slots[s] = (j, k // s_)
        if k == 0:
          enter = j
        if k == layers - 1:
          leave = j
    schedule.append(Iteration(enter, slots, leave))
  return schedule


def _stage_mask(mesh, stages_dim, stages, dtype):
  """A [stages_dim] tensor, 1 on the given stages and 0 elsewhere."""
  value = np.zeros([stages_dim.size], dtype=dtype.as_numpy_dtype)
  value[list(stages)] = 1
  return constant(mesh, value, Shape([stages_dim]), dtype=dtype)


def _check_stage_output(y, buffer, repeat, name):
  """y (the stage function's output) laid out like the buffer, or a ShapeError."""
  if not hasattr(y, "shape") or not hasattr(y, "mesh"):
    raise ShapeError("%s: stage_fn(h, %d) returned %r, not an mtf Tensor" % (
        name, repeat, y), op=name)
  for d in buffer.shape.dims:
    if d not in y.shape.dims:
      raise ShapeError(
          "%s: stage_fn(h, %d) output %s %s lacks dim %s of its input %s; a stage must "
          "keep the buffer's shape (the stages dim included) so that its output can move "
          "to the next stage" % (name, repeat, y.name, y.shape, d, buffer.shape),
          op=name, tensor=y.name, dim=d.name)
  extra = [d for d in y.shape.dims if d not in buffer.shape.dims]
  if extra:
    raise ShapeError(
        "%s: stage_fn(h, %d) output %s %s has dim %s that its input %s lacks; a stage "
        "must keep the buffer's shape" % (name, repeat, y.name, y.shape, extra[0],
                                          buffer.shape),
        op=name, tensor=y.name, dim=extra[0].name)
  if y.dtype != buffer.dtype:
    raise ShapeError("%s: stage_fn(h, %d) output %s is %s, its input %s" % (
        name, repeat, y.name, y.dtype.name, buffer.dtype.name), op=name, tensor=y.name)
  if y.shape != buffer.shape:
    y = transpose(y, buffer.shape)
  return y


def pipeline(stage_fn, x, stages_dim, microbatch_dim, num_microbatches=None,
             num_repeats=1, batch_dim=None, name="pipeline"):
  """Runs x through S * R layers as an S-stage pipeline of microbatches.

  Args:
    stage_fn: fn(h, repeat) -> a Tensor of h's shape, h being x's microbatch shape plus
      `stages_dim` (one microbatch per stage). Its variables must carry `stages_dim`, so
      that stage s applies its own weights; it is called in the reusing variable scope
      "<name>/repeat_<repeat>" (give layers explicit names). Layer r * S + s of the
      model is stage s of repeat r.
    x: the input Tensor; its batch dim is cut into microbatches.
    stages_dim: Dimension of size S (split it over a mesh dim to pipeline).
    microbatch_dim: Dimension of size num_microbatches, or a name.
    num_microbatches: M (default: microbatch_dim's size). The batch must divide by it;
      microbatch j holds the batch entries j, j + M, j + 2M, ...
    num_repeats: R; more than 1 is the circular schedule (the buffer goes round the
      stages R times, `shift` with wrap so the last stage feeds stage 0).
    batch_dim: the dim of x to cut (default: x's first dim).
    name: the variable scope, and the name in error messages.

  Returns:
    x's shape: stage_fn's layers applied to every microbatch, in order, in
    len(pipeline_schedule(S, M, R)) iterations (M + S - 1 when R is 1).
  """
  stages_dim = convert_to_dimension(stages_dim)
  if isinstance(microbatch_dim, str):
    if num_microbatches is None:
      raise ShapeError("%s: microbatch_dim %r is a name; give num_microbatches" % (
          name, microbatch_dim), op=name, dim=microbatch_dim)
    microbatch_dim = Dimension(microbatch_dim, num_microbatches)
  microbatch_dim = convert_to_dimension(microbatch_dim)
  if num_microbatches is None:
    num_microbatches = microbatch_dim.size
  if microbatch_dim.size != num_microbatches:
    raise ShapeError("%s: microbatch_dim %s does not have num_microbatches=%d entries" % (
        name, microbatch_dim, num_microbatches), op=name, dim=microbatch_dim.name)
  batch_dim = x.shape.dims[0] if batch_dim is None else convert_to_dimension(batch_dim)
  names = x.shape.dimension_names
  if batch_dim not in x.shape.dims:
    raise ShapeError("%s: batch dim %s is not a dim of %s %s" % (
        name, batch_dim, x.name, x.shape), op=name, tensor=x.name, dim=batch_dim.name)
  for d in (stages_dim, microbatch_dim):
    if d.name in names:
      raise ShapeError("%s: %s is already a dim of input %s %s; name it differently" % (
          name, d, x.name, x.shape), op=name, tensor=x.name, dim=d.name)
  if batch_dim.size % num_microbatches:
    raise ShapeError("%s: batch dim %s of %s does not divide into %d microbatches" % (
        name, batch_dim, x.name, num_microbatches), op=name, tensor=x.name,
                     dim=batch_dim.name)
  if num_repeats < 1:
    raise ShapeError("%s: num_repeats must be at least 1, got %r" % (name, num_repeats),
                     op=name)
  num_stages, mesh, dtype = stages_dim.size, x.mesh, x.dtype
  schedule = pipeline_schedule(num_stages, num_microbatches, num_repeats)

  # [..., batch, ...] -> [..., batch / M, microbatch, ...]: microbatch j takes the
  # entries j, j + M, ... so a batch split over a mesh dim stays where it is.
  small_batch = Dimension(batch_dim.name, batch_dim.size // num_microbatches)
  split = replace_dimensions(x, batch_dim, [small_batch, microbatch_dim])
  microbatches = (unstack(split, microbatch_dim) if num_microbatches > 1 else
                  [reshape(split, split.shape - [microbatch_dim])])
  buffer_shape = Shape([stages_dim] + microbatches[0].shape.dims)
  first = _stage_mask(mesh, stages_dim, [0], dtype)
  not_first = _stage_mask(mesh, stages_dim, range(1, num_stages), dtype)
  last = _stage_mask(mesh, stages_dim, [num_stages - 1], dtype)

  def run_stage(h, r):
    with variable_scope(name), variable_scope("repeat_%d" % r, reuse=True):
      y = stage_fn(h, r)
    return _check_stage_output(y, h, r, name)

  outputs = [None] * num_microbatches
  buffer = zeros(mesh, buffer_shape, dtype)
  for t, it in enumerate(schedule):
    if t:
      buffer = shift(buffer, 1, stages_dim, wrap=num_repeats > 1)
    if it.enter is not None:
      buffer = (einsum([buffer, not_first], output_shape=buffer_shape) +
                einsum([microbatches[it.enter], first], output_shape=buffer_shape))
    repeats = sorted(set(r for _, r in it.slots.values()))
    if len(repeats) == 1:
      buffer = run_stage(buffer, repeats[0])
    else:
      # Stages run different repeats (circular schedule): each repeat runs on the whole
      # buffer and a mask keeps it on the stages that hold a microbatch of that repeat.
      parts = []
      for r in repeats:
        y = run_stage(buffer, r)
        mine = [s for s, (_, rs) in it.slots.items() if rs == r]
        parts.append(einsum([y, _stage_mask(mesh, stages_dim, mine, dtype)],
                            output_shape=buffer_shape))
      buffer = sum(parts[1:], parts[0])
    if it.leave is not None:
      outputs[it.leave] = einsum([buffer, last], output_shape=microbatches[0].shape)

  axis = split.shape.dims.index(microbatch_dim)
  out = (stack(outputs, microbatch_dim.name, axis=axis) if num_microbatches > 1
         else reshape(outputs[0], split.shape))
  return reshape(out, x.shape)
