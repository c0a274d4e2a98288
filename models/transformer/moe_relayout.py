"""Layout-aware reshapes of the MoE layer: `relayout_rename` and `reshape_keeping_splits`.

`relayout_rename` renames dims (same sizes, same order), moving mesh splits with all-to-all.

A mixture-of-experts layer holds its dispatched tokens first as [experts_unsplit, groups,
...] with the groups split over a mesh dim (like the batch), then as [experts,
groups_unsplit, ...] with the experts split over that same mesh dim. Only the dim names
differ, so the data never changes place in row-major order; what changes is which dim a
mesh axis cuts. When a mesh axis moves from one dim to another, each processor sends the
piece of the new split dim owned by every peer and concatenates what it receives along the
old split dim: one all-to-all, (n-1)/n of a slice sent per processor, where mtf.reshape
would gather the whole dim (allconcat) and cut it again.

`reshape_keeping_splits` regroups tokens, e.g. [batch=8, length=16, d] into [batch=16,
group=8, d], with the batch split over the same mesh dim in both. mtf.reshape keeps a split
only when the split Dimension itself is unchanged; but a mesh axis cutting a dim whose
preceding dims have the same total size in both shapes selects the same elements (flat
index f is on piece (f // (N / (P * m))) % m, with P that product and m the mesh size), in
the same row-major order, so each processor reshapes its own slice and nothing moves.
"""
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import ShapeError


def _axis_positions(impl, shape):
  """{mesh axis: tensor axis} for the axes that split a dim of shape."""
  layout = impl.tensor_layout(shape)
  return {a: i for i, a in enumerate(layout) if a is not None}


class RelayoutRenameOperation(mtf.Operation):
  """x with its dims renamed to new_shape (same sizes in the same order).

  Lowering: a mesh axis that splits the same position in both shapes stays put; one that
  moves to a position whole in the old layout, from a position whole in the new layout,
  is an alltoall; any other split is gathered before and cut after (as mtf.reshape does).
  """

  def __init__(self, x, new_shape, name=None):
    super().__init__([x], name=name or "relayout_rename")
    new_shape = mtf.convert_to_shape(new_shape)
    if new_shape.to_integer_list != x.shape.to_integer_list:
      raise ShapeError(
          "relayout_rename of %s: new shape %s must have the sizes of %s in the same order"
          % (x.name, new_shape, x.shape), op=self.name, tensor=x.name)
    self._add_output(new_shape, x.dtype)

  def gradient(self, grad_ys):
    return [relayout_rename(grad_ys[0], self.inputs[0].shape)]

  def plan(self, impl):
    """(old dim names to gather, [(mesh axis, split axis, concat axis)], new dims to cut)."""
    x, y = self.inputs[0], self.outputs[0]
    old_pos, new_pos = _axis_positions(impl, x.shape), _axis_positions(impl, y.shape)
    old_at = set(old_pos.values())
    new_at = set(new_pos.values())
    gather, moves, split = [], [], []
    for a, i in old_pos.items():
      j = new_pos.get(a)
      if j == i:
        continue
      if j is not None and j not in old_at and i not in new_at:
        moves.append((a, j, i))
      else:
        gather.append(x.shape.dims[i].name)
    moved = {a for a, _, _ in moves}
    for a, j in new_pos.items():
      if old_pos.get(a) != j and a not in moved:
        split.append(y.shape.dims[j].name)
    return gather, moves, split

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, y = self.inputs[0], self.outputs[0]
    gather, moves, split = self.plan(impl)
    laid = impl.gather_dims(lowering.tensors[x], x.shape, gather)
    for mesh_axis, split_axis, concat_axis in moves:
      laid = impl.alltoall(laid, mesh_axis, split_axis, concat_axis)
    lowering.set_tensor_lowering(y, impl.split_dims(laid, y.shape, split))


def relayout_rename(x, new_shape, name=None):
  """x with dims renamed to new_shape; see RelayoutRenameOperation."""
  new_shape = mtf.convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return RelayoutRenameOperation(x, new_shape, name=name).outputs[0]


def _kept_axes(impl, old_shape, new_shape):
  """Mesh axes splitting a dim preceded by equal-size prefixes in both shapes.

  With equal total sizes, equal prefix sizes means equal (dim size * row-major stride).
  """
  def block(shape):
    return {a: d.size * stride for d, a, stride in zip(
        shape.dims, impl.tensor_layout(shape), shape.cumprod) if a is not None}
  old_block, new_block = block(old_shape), block(new_shape)
  return {a for a, b in old_block.items() if new_block.get(a) == b}


class ReshapeKeepingSplitsOperation(mtf.Operation):
  """mtf.reshape that keeps every mesh split whose dim keeps its prefix size."""

  def __init__(self, x, new_shape, name=None):
    super().__init__([x], name=name or "reshape_keeping_splits")
    new_shape = mtf.convert_to_shape(new_shape)
    if new_shape.size != x.shape.size:
      raise ShapeError("reshape_keeping_splits of %s from %s to %s: sizes differ" % (
          x.name, x.shape, new_shape), op=self.name, tensor=x.name)
    self._add_output(new_shape, x.dtype)

  def gradient(self, grad_ys):
    return [reshape_keeping_splits(grad_ys[0], self.inputs[0].shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, y = self.inputs[0], self.outputs[0]
    kept = _kept_axes(impl, x.shape, y.shape)
    old_layout, new_layout = impl.tensor_layout(x.shape), impl.tensor_layout(y.shape)
    gather = [d.name for d, a in zip(x.shape.dims, old_layout)
              if a is not None and a not in kept]
    split = [d.name for d, a in zip(y.shape.dims, new_layout)
             if a is not None and a not in kept]
    local = [d.size // impl.shape[a].size if a in kept else d.size
             for d, a in zip(y.shape.dims, new_layout)]
    laid = impl.gather_dims(lowering.tensors[x], x.shape, gather)
    laid = impl.slicewise(lambda t: tf.reshape(t, local), laid)
    lowering.set_tensor_lowering(y, impl.split_dims(laid, y.shape, split))


def reshape_keeping_splits(x, new_shape, name=None):
  """x reshaped to new_shape (row-major), moving no data along kept splits."""
  new_shape = mtf.convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return ReshapeKeepingSplitsOperation(x, new_shape, name=name).outputs[0]
