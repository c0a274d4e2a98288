"""The plan (an OpPlan, see steps.py) of each communicating op family, from shapes and a
MeshLayout only; ops call these from their `plan(layout)` method."""
from mesh_tf.errors import LayoutError
from mesh_tf.plans.steps import (Allconcat, Allreduce, Allsplit, Alltoall, Middle,
                                 OpPlan, Operand, Receive, ReduceScatter)
from mesh_tf.shapes.dimension import Dimension
from mesh_tf.shapes.shape import Shape, list_product


def gather_steps(layout, shape, dim_names):
  """Allconcats making the named split dims of shape whole, in shape order."""
  split = layout.split_axes(shape)
  return [Allconcat(d.name, split[d.name]) for d in shape.dims
          if d.name in dim_names and d.name in split]


def split_steps(layout, shape, dim_names):
  """Allsplits cutting the named dims of shape back to the layout, in shape order."""
  split = layout.split_axes(shape)
  return [Allsplit(d.name, split[d.name]) for d in shape.dims
          if d.name in dim_names and d.name in split]


def _owed_sum(mesh_axes):
  return [Allreduce(tuple(mesh_axes), "SUM", True)] if mesh_axes else []


# ---- einsum ----
def einsum_dims_to_gather(layout, input_shapes, output_shape):
  """Names of contracted dims to make whole so no mesh axis splits two dims of the union
  (a local einsum would pair only matching slices). Output dims keep their split; of the
  others, the first dim met on each axis keeps it and later ones are gathered."""
  owner, gather = {}, set()
  for s in [output_shape] + list(input_shapes):
    for d, a in zip(s.dims, layout.tensor_layout(s)):
      if a is not None and owner.setdefault(a, d.name) != d.name:
        gather.add(d.name)
  return gather


def einsum_plan(layout, input_shapes, output_shape):
  """Gather the contracted dims that must be whole; the local result owes a SUM over the
  mesh axes splitting a contracted dim that stays split."""
  gather = einsum_dims_to_gather(layout, input_shapes, output_shape)
  reduced, local = set(), {}
  for s in input_shapes:
    for d, a in zip(s.dims, layout.tensor_layout(s)):
      split = a is not None and d.name not in gather
      local[d.name] = d.size // layout.axis_size(a) if split else d.size
      if split and d not in output_shape.dims:
        reduced.add(a)
  return OpPlan([Operand(i, gather_steps(layout, s, gather))
                 for i, s in enumerate(input_shapes)],
                [_owed_sum(sorted(reduced))], 2.0 * list_product(list(local.values())))


# ---- reductions ----
def reduce_plan(layout, input_shape, output_shape, reduction):
  """Local reduction, then an allreduce over the mesh axes of the reduced split dims (a
  SUM stays owed, as an einsum's: readers that add partial sums keep it owing, and a
  backend that packs allreduces pays it with the others)."""
  axes = [a for d, a in zip(input_shape.dims, layout.tensor_layout(input_shape))
          if a is not None and d not in output_shape.dims]
  owed = reduction.upper() == "SUM"
  return OpPlan([Operand(0, [])], [[Allreduce(tuple(axes), reduction, owed)] if axes else []],
                float(layout.slice_size(input_shape)))


def _reduced_allreduces(layout, shape, reduced_dim, itemsize, reductions):
  """Middles allreducing shape - [reduced_dim] once per reduction over the mesh axis that
  splits reduced_dim; none where it is whole."""
  a = layout.split_axes(shape).get(reduced_dim.name)
  if a is None:
    return ()
  reduced = shape - [reduced_dim]
  split = layout.split_axes(reduced)
  return tuple(Middle(reduced, dict(split), [Allreduce((a,), r)], itemsize)
               for r in reductions)


def softmax_plan(layout, input_shape, reduced_dim, itemsize):
  """Fused softmax / log_softmax / logsumexp over reduced_dim: where it is split, the
  local max is allreduced (MAX), then the local sum of exp(x - max) (SUM)."""
  return OpPlan([Operand(0, [])], [[]], 4.0 * layout.slice_size(input_shape),
                middle=_reduced_allreduces(layout, input_shape, reduced_dim, itemsize,
                                           ("MAX", "SUM")))


def cross_entropy_plan(layout, logits_shape, vocab_dim, itemsize):
  """Cross-entropy of logits against one-hot ids: where vocab is split, the softmax's MAX
  and SUM allreduces, then a SUM of the target's logit, all on [logits - vocab]."""
  return OpPlan([Operand(0, []), Operand(1, [])], [[], [], []],
                6.0 * layout.slice_size(logits_shape),
                middle=_reduced_allreduces(layout, logits_shape, vocab_dim, itemsize,
                                           ("MAX", "SUM", "SUM")))


# ---- add_n ----
def add_n_plan(layout, shape, owed_axes):
  """owed_axes: per input, the mesh axes of the SUM it still owes (None: none). Partial
  sums owing one allreduce are added locally and the sum owes it once."""
  n = len(owed_axes)
  if len(set(owed_axes)) == 1 and owed_axes[0] is not None:
    return OpPlan([Operand(i, []) for i in range(n)], [_owed_sum(owed_axes[0])], 0.0,
                  reads_partial_sums=True)
  return OpPlan([Operand(i, []) for i in range(n)], [[]],
                float(n * layout.slice_size(shape)))


# ---- ops that need some dims whole (slicewise, pooling, convolution) ----
def whole_dims_plan(layout, input_shapes, output_shapes, whole, summed_axes=()):
  """Gather the dims in `whole`, compute, allreduce (SUM) over summed_axes, cut the whole
  dims of each output back to its layout."""
  summed = [Allreduce(tuple(summed_axes), "SUM")] if summed_axes else []
  return OpPlan([Operand(i, gather_steps(layout, s, whole))
                 for i, s in enumerate(input_shapes)],
                [summed + split_steps(layout, s, whole) for s in output_shapes],
                float(sum(layout.slice_size(s) for s in output_shapes)))


# ---- reshape ----
def _prefix_products(shape):
  """{dim name: product of the sizes before it} (its row-major block position)."""
  out, p = {}, 1
  for d in shape.dims:
    out[d.name], p = p, p * d.size
  return out


def reshape_plan(layout, old_shape, new_shape):
  """Which splits a reshape keeps, moves (all-to-all), gathers and cuts.

  A split is kept (each processor reshapes its own slice) when the mesh axis cuts dims
  with equal prefix products (sizes of the dims before) in both shapes. When it cuts old
  dim A and new dim B with different prefixes, and the old shape has a whole dim B' with
  B's prefix (divisible by the axis size), one alltoall moves the split from A to B'. Any
  other split of the old shape is gathered, and of the new shape cut after.
  """
  old_split, new_split = layout.split_axes(old_shape), layout.split_axes(new_shape)
  old_pre, new_pre = _prefix_products(old_shape), _prefix_products(new_shape)
  old_on = {a: d for d, a in old_split.items()}
  new_on = {a: d for d, a in new_split.items()}
  moves, gathers, taken = [], [], set()
  for d in old_shape.dims:
    a = old_split.get(d.name)
    if a is None:
      continue
    target = new_on.get(a)
    if target is not None and old_pre[d.name] == new_pre[target]:
      continue  # kept
    if target is not None:
      m = layout.axis_size(a)
      candidates = [c.name for c in old_shape.dims
                    if old_pre[c.name] == new_pre[target] and c.name not in old_split
                    and c.name not in taken and c.size % m == 0 and c.size >= m]
      if candidates:
        taken.add(candidates[0])
        moves.append(Alltoall(a, candidates[0], d.name))
        continue
    gathers.append(Allconcat(d.name, a))
  moved = {s.mesh_axis for s in moves}
  kept = {a for a, d in old_on.items() if a in new_on and (
      a in moved or old_pre[d] == new_pre[new_on[a]])}
  cuts = [Allsplit(d.name, new_split[d.name]) for d in new_shape.dims
          if d.name in new_split and new_split[d.name] not in kept]
  return OpPlan([Operand(0, moves + gathers)], [cuts], 0.0)


def reduce_scatter_reshape_plan(layout, old_shape, new_shape, owed_axes):
  """reshape_plan for an input still owing a SUM over owed_axes (or None). When the
  reshape only cuts, and cuts a dim on every owed axis, the partial sums are reshaped
  locally and those cuts become reduce-scatters; otherwise the SUM is paid first."""
  plan = reshape_plan(layout, old_shape, new_shape)
  cuts = plan.outputs[0]
  cut_axes = {s.mesh_axis for s in cuts}
  if not owed_axes or plan.operands[0].steps or not set(owed_axes) <= cut_axes:
    return plan
  steps = [ReduceScatter(s.dim, s.mesh_axis) if s.mesh_axis in owed_axes else s
           for s in cuts]
  return OpPlan([Operand(0, [])], [steps], 0.0, reads_partial_sums=True)


# ---- shifts ----
def shift_sources(n, offset, wrap):
  """For each coordinate on a mesh axis of n processors, the coordinate it receives from
  when everything moves `offset` positions up (None: zeros)."""
  if wrap:
    return tuple((i - offset) % n for i in range(n))
  return tuple(i - offset if 0 <= i - offset < n else None for i in range(n))


def shift_plan(layout, shape, dim_name, offset, wrap):
  """A shift along a split dim by at most one slice receives the neighbour's slice (the
  plan's second operand); a larger (or zero) shift gathers the dim and cuts it after."""
  a = layout.split_axes(shape).get(dim_name)
  if a is None:
    return OpPlan([Operand(0, [])], [[]])
  local = shape.dims[shape.dimension_names.index(dim_name)].size // layout.axis_size(a)
  if abs(offset) > local or offset == 0:
    return OpPlan([Operand(0, [Allconcat(dim_name, a)])], [[Allsplit(dim_name, a)]])
  sources = shift_sources(layout.axis_size(a), 1 if offset > 0 else -1, wrap)
  return OpPlan([Operand(0, []), Operand(0, [Receive(a, sources)])], [[]])


# ---- gather (embedding lookup) and its gradient ----
def gather_mesh_axis(layout, op_name, weights_shape, indices_shape, dim):
  """Mesh axis splitting the gathered dim (or None); raises LayoutError if it also splits
  a dim of the indices."""
  a = layout.split_axes(weights_shape).get(dim.name)
  if a is not None and a in layout.tensor_layout(indices_shape).mesh_axes:
    raise LayoutError(
        "gather %r: mesh axis %s splits both the gathered dim %s and a dim of the indices "
        "%s; lay one of them out on another mesh axis" % (
            op_name, layout.shape[a].name, dim.name, indices_shape), op=op_name,
        dim=dim.name)
  return a


def gather_plan(layout, op_name, weights_shape, indices_shape, dim, output_shape):
  """Local lookup of the rows in this slice (zeros elsewhere); owes a SUM over the mesh
  axis splitting the gathered dim."""
  a = gather_mesh_axis(layout, op_name, weights_shape, indices_shape, dim)
  return OpPlan([Operand(0, []), Operand(1, [])], [_owed_sum([] if a is None else [a])],
                float(layout.slice_size(output_shape)))


def gather_grad_plan(layout, op_name, dy_shape, indices_shape, weights_shape, dim):
  """Local segment sum of dy into the slice's rows; owes a SUM over the mesh axes
  splitting the indices."""
  gather_mesh_axis(layout, op_name, weights_shape, indices_shape, dim)
  axes = sorted(layout.tensor_layout(indices_shape).mesh_axes)
  return OpPlan([Operand(0, []), Operand(1, [])], [_owed_sum(axes)],
                float(layout.slice_size(dy_shape)))


# ---- top_k ----
def top_k_plan(layout, input_shape, reduced_dim, k_dim, value_itemsize):
  """Each processor takes the top k of its slice of reduced_dim; where a mesh axis splits
  it, the candidates (values, then int32 indices) are gathered over it for a second top
  k. The k dim of the outputs is cut to their layout after."""
  out_shape = Shape([d for d in input_shape.dims if d != reduced_dim] + [k_dim])
  split = layout.split_axes(input_shape)
  a = split.pop(reduced_dim.name, None)
  middle = ()
  if a is not None:
    n = layout.axis_size(a)
    per_processor = min(k_dim.size, reduced_dim.size // n)
    candidates = Shape(out_shape.dims[:-1] + [Dimension(k_dim.name, per_processor * n)])
    split[k_dim.name] = a
    middle = tuple(Middle(candidates, dict(split), [Allconcat(k_dim.name, a)], size)
                   for size in (value_itemsize, 4))
  cut = split_steps(layout, out_shape, {k_dim.name})
  return OpPlan([Operand(0, [])], [cut, cut], float(layout.slice_size(input_shape)),
                middle=middle)
