"""Halo exchange: give each block of a blocked dimension the margins of its neighbours.

An image cut into blocks has a blocks dim (which block; may be split over the mesh) and a
block-size dim (whole on every processor) per spatial axis. The margins ("halos") travel
with `mtf.shift` along the blocks dim, which swaps edges with the neighbouring processor
when that dim is split; margins wider than a block take whole neighbour blocks too.
"""
from mesh_tf.errors import ShapeError
from mesh_tf.ops.slicing import concat, mtf_slice, shift
from mesh_tf.shapes import Dimension


def _dim(x, dim, role, what):
  name = dim.name if isinstance(dim, Dimension) else dim
  if name not in x.shape.dimension_names:
    raise ShapeError("%s: %s %r is not a dim of %s %s" % (what, role, name, x.name, x.shape),
                     tensor=x.name, dim=name)
  return x.shape.get_dim_by_name(name)


def _margin(x, blocks_dim, size_dim, amount, side, wrap):
  """The `amount` positions just before (side=-1) or after (side=+1) each block, as a list
  of pieces in position order. Block i's neighbour i-k is shift(x, +k) on blocks_dim."""
  full, partial = divmod(amount, size_dim.size)
  if side < 0:
    pieces = [shift(x, k, blocks_dim.name, wrap) for k in range(full, 0, -1)]
    if partial:
      edge = mtf_slice(x, size_dim.size - partial, partial, size_dim.name)
      pieces.insert(0, shift(edge, full + 1, blocks_dim.name, wrap))
  else:
    pieces = [shift(x, -k, blocks_dim.name, wrap) for k in range(1, full + 1)]
    if partial:
      edge = mtf_slice(x, 0, partial, size_dim.name)
      pieces.append(shift(edge, -(full + 1), blocks_dim.name, wrap))
  return pieces


def halo_exchange_sides(x, blocks_dim, block_size_dim, left, right, wrap=False):
  """Extends each block by `left` positions of what precedes it and `right` of what
  follows it along block_size_dim (which grows by left + right)."""
  what = "halo_exchange"
  blocks_dim = _dim(x, blocks_dim, "blocks_dim", what)
  block_size_dim = _dim(x, block_size_dim, "block_size_dim", what)
  if blocks_dim == block_size_dim:
    raise ShapeError("%s: blocks_dim and block_size_dim are both %s" % (what, blocks_dim),
                     tensor=x.name, dim=blocks_dim.name)
  if left < 0 or right < 0:
    raise ShapeError("%s: halo sizes must be >= 0, got %d and %d for %s of %s" % (
        what, left, right, block_size_dim, x.name), tensor=x.name, dim=block_size_dim.name)
  if not left and not right:
    return x
  parts = []
  if left:
    parts += _margin(x, blocks_dim, block_size_dim, left, -1, wrap)
  parts.append(x)
  if right:
    parts += _margin(x, blocks_dim, block_size_dim, right, +1, wrap)
  return concat(parts, block_size_dim.name)


def halo_exchange(x, blocks_dim, block_size_dim, halo_size, wrap=False):
  """Concatenates to each block (along block_size_dim, which grows by 2 * halo_size) the
  halo_size positions on both sides of it; blocks_dim numbers the blocks, and with wrap the
  margins past the ends come from the other end instead of zeros."""
  return halo_exchange_sides(x, blocks_dim, block_size_dim, halo_size, halo_size, wrap)


def left_halo_exchange(x, blocks_dim, block_size_dim, halo_size, wrap=False):
  """Like halo_exchange, but only the margin on the left (lower-index) side."""
  return halo_exchange_sides(x, blocks_dim, block_size_dim, halo_size, 0, wrap)
