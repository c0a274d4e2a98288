"""Who holds what: a picture of the mesh and the slice of a tensor each processor holds.

`visualize_sharding` draws the processors of a mesh as a text grid (2-D mesh: rows x
cols; 1-D: one row; more dims: one grid per coordinate of the leading dims), each cell
naming the processor number and the slice it holds of every tensor dim, e.g.
`p3 batch[8:16] d_ff[0:32]`, under a header saying which dim is split over which mesh dim
and over which mesh dims the tensor is replicated. `plot_sharding` draws the same grid
with matplotlib, one color per distinct slice. The slices come from MeshLayout (what
every backend uses), so the picture is what the backends hold.
"""
import collections
import math
import sys
import textwrap

from mesh_tf.shapes import MeshLayout
from mesh_tf.shapes import convert_to_shape
from mesh_tf.shapes import pnum_to_processor_coordinates

_SHORT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                 "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
                 "uint8": "u8", "complex64": "c64", "complex128": "c128"}
# legend lines listing which processors hold each replicated slice, at most
_MAX_LEGEND_GROUPS = 16

Holding = collections.namedtuple("Holding", ["pnum", "coordinates", "begin", "slice_id"])
Holding.__doc__ = ("One processor's slice: its number, mesh coordinates, the offset of its "
                   "slice in the full tensor, and the index of its distinct slice.")


class _View(object):
  """The tensor, the mesh layout, and the slice every processor holds."""

  def __init__(self, tensor_or_shape, mesh_impl, mesh_shape, layout):
    self.layout = _mesh_layout(mesh_impl, mesh_shape, layout)
    full_name = None
    if hasattr(tensor_or_shape, "operation"):  # an mtf Tensor
      full_name = tensor_or_shape.name
      self.name = _short_name(full_name)
      dtype = getattr(tensor_or_shape.dtype, "name", str(tensor_or_shape.dtype))
      self.dtype = _SHORT_DTYPES.get(dtype, dtype)
      self.shape = tensor_or_shape.shape
    else:
      self.name, self.dtype = None, None
      self.shape = convert_to_shape(tensor_or_shape)
    # The library's own lookup: raises LayoutError naming the tensor, dim and rule.
    self.tensor_layout = self.layout.tensor_layout(self.shape, tensor_name=full_name)
    self.slice_shape = self.layout.slice_shape(self.shape)
    mesh = self.layout.shape
    begins = {}
    self.holdings = []
    for pnum in range(mesh.size):
      begin = tuple(self.layout.slice_begin(self.shape, pnum))
      slice_id = begins.setdefault(begin, len(begins))
      self.holdings.append(Holding(pnum, tuple(pnum_to_processor_coordinates(mesh, pnum)),
                                   begin, slice_id))
    self.num_slices = len(begins)

  def dim_slices(self, holding):
    """["batch[8:16]", ...]: the slice of each tensor dim `holding` holds."""
    return ["%s[%d:%d]" % (d.name, b, b + n)
            for d, b, n in zip(self.shape.dims, holding.begin, self.slice_shape)]

  def cell_tokens(self, holding):
    return ["p%d" % holding.pnum] + (self.dim_slices(holding) or ["scalar"])

  def header(self):
    """The first line: dtype, name, shape, which dim is split where, replication."""
    what = " ".join(x for x in (self.dtype, self.name) if x)
    text = "%s[%s]" % (what + " " if what else "",
                       ", ".join("%s:%d" % (d.name, d.size) for d in self.shape.dims))
    mesh = self.layout.shape
    splits = ["%s split over %s (%d)" % (d.name, mesh[a].name, mesh[a].size)
              for d, a in zip(self.shape.dims, self.tensor_layout) if a is not None]
    unused = [m for i, m in enumerate(mesh.dims) if i not in self.tensor_layout.mesh_axes]
    if splits:
      text += ", " + ", ".join(splits)
    if not mesh.dims:
      text += ", on a single processor"
    elif not splits:
      text += ", replicated on all %d processors (%s)" % (
          mesh.size, " x ".join("%s:%d" % (m.name, m.size) for m in unused))
    elif unused:
      text += "; replicated over %s" % " and ".join(
          "%s (%d)" % (m.name, m.size) for m in unused)
    return text

  def mesh_line(self):
    mesh = self.layout.shape
    if not mesh.dims:
      return "mesh: a single processor (empty mesh shape)"
    if mesh.ndims == 1:
      grid = "one row of %s" % mesh[0].name
    else:
      grid = "%s down, %s across" % (mesh[-2].name, mesh[-1].name)
      if mesh.ndims > 2:
        grid += ", one grid per %s" % " x ".join(m.name for m in mesh.dims[:-2])
    return "mesh %s (%d processors), layout \"%s\"; grid: %s" % (
        mesh.to_string, mesh.size, self.layout.layout_rules, grid)

  def notes(self):
    """Rules for a dim of this tensor whose mesh dim this mesh lacks (split nothing)."""
    names = set(self.shape.dimension_names)
    return ["note: rule %s:%s names mesh dim \"%s\", which mesh %s lacks; %s is not split "
            "by it" % (t, m, m, self.layout.shape.to_string or "(empty)", t)
            for t, m in self.layout.rules_naming_absent_mesh_dims() if t in names]

  def legend(self):
    n = len(self.holdings)
    size = "x".join(str(s) for s in self.slice_shape) or "scalar"
    elements = math.prod(self.slice_shape)
    what = "slice %s (%s element%s)" % (size, format(elements, ","),
                                        "" if elements == 1 else "s")
    if n == 1:
      return ["1 processor, holding the whole tensor: a %s" % what]
    if self.num_slices == n:
      return ["%d distinct slices, one per processor; each a %s" % (n, what)]
    lines = ["%d distinct slice%s, each held by %d processors (replicas: same slice text); "
             "each a %s" % (self.num_slices, "" if self.num_slices == 1 else "s",
                            n // self.num_slices, what)]
    groups = collections.OrderedDict()
    for h in self.holdings:
      groups.setdefault(h.slice_id, []).append(h)
    for slice_id, holders in list(groups.items())[:_MAX_LEGEND_GROUPS]:
      lines.append("  %s: %s" % (" ".join(self.dim_slices(holders[0])) or "scalar",
                                 " ".join("p%d" % h.pnum for h in holders)))
    if len(groups) > _MAX_LEGEND_GROUPS:
      lines.append("  ... (%d more)" % (len(groups) - _MAX_LEGEND_GROUPS))
    return lines

  def column_name(self):
    mesh = self.layout.shape
    return mesh[-1].name if mesh.ndims else "processor"

  def grids(self):
    """[(title or None, rows of Holdings)]: the last two mesh dims of each grid."""
    mesh = self.layout.shape
    if mesh.ndims <= 1:
      return [(None, [self.holdings])]
    rows, cols = mesh[-2].size, mesh[-1].size
    per_grid = rows * cols
    out = []
    for start in range(0, len(self.holdings), per_grid):
      block = self.holdings[start:start + per_grid]
      title = None
      if mesh.ndims > 2:
        title = "%s:" % ", ".join("%s=%d" % (m.name, c) for m, c in
                                  zip(mesh.dims[:-2], block[0].coordinates[:-2]))
      out.append((title, [block[r * cols:(r + 1) * cols] for r in range(rows)]))
    return out


def _short_name(name):
  return name[:-2] if name and name.endswith(":0") else name


def _mesh_layout(mesh_impl, mesh_shape, layout):
  """The MeshLayout of a MeshImpl (or MeshLayout), or of mesh_shape and layout."""
  if mesh_impl is not None:
    if mesh_shape is not None or layout is not None:
      raise ValueError("give either mesh_impl, or mesh_shape and layout, not both "
                       "(got mesh_impl=%r, mesh_shape=%r, layout=%r)"
                       % (mesh_impl, mesh_shape, layout))
    if not (isinstance(mesh_impl, MeshLayout) or hasattr(mesh_impl, "mesh_layout")):
      raise TypeError("mesh_impl must be a MeshImpl or a MeshLayout, got %r; to give a "
                      "mesh shape and layout rules, pass mesh_shape=... and layout=..."
                      % (mesh_impl,))
    # mesh_layout, not slice_layout: GSPMD's values are whole but XLA shards them by it.
    return MeshLayout.of(mesh_impl)
  if mesh_shape is None:
    if layout is not None:
      raise ValueError("layout=%r needs mesh_shape= too (e.g. mesh_shape=\"rows:2;cols:4\")"
                       % (layout,))
    raise ValueError("visualize_sharding needs a mesh: pass a MeshImpl, or mesh_shape= "
                     "(and layout=, default: no dim split)")
  return MeshLayout(mesh_shape, layout)


def _cell_layout(cells, width):
  """The text lines of every cell, laid out alike: one line each if all fit in width,
  else the processor number, then as many dim slices per line as fit in every cell."""
  if all(len(" ".join(c)) <= width for c in cells):
    return [[" ".join(c)] for c in cells]
  ndims = max(len(c) - 1 for c in cells)
  per_line = 1
  for k in range(ndims, 1, -1):
    if all(len(" ".join(c[1:][i:i + k])) <= width
           for c in cells for i in range(0, len(c) - 1, k)):
      per_line = k
      break
  return [[c[0]] + [" ".join(c[1:][i:i + per_line]) for i in range(0, len(c) - 1, per_line)]
          for c in cells]


def _grid_lines(grids, max_width, col_name):
  """Lines of box grids [(title or None, rows of cells (token lists))]; columns that do
  not fit in max_width are drawn in bands, one below the other."""
  cells = [c for _, rows in grids for row in rows for c in row]
  ncols = len(grids[0][1][0])
  longest = max(len(t) for c in cells for t in c)
  per_band = max(1, min(ncols, (max_width - 1) // (longest + 3)))
  per_band = -(-ncols // -(-ncols // per_band))  # as many bands, of even widths
  laid = iter(_cell_layout(cells, (max_width - 1) // per_band - 3))
  laid = [(title, [[next(laid) for _ in row] for row in rows]) for title, rows in grids]
  width = max(len(line) for _, rows in laid for row in rows for c in row for line in c)
  lines = []
  for title, rows in laid:
    if title:
      lines.append(title)
    for start in range(0, ncols, per_band):
      n = min(per_band, ncols - start)
      if per_band < ncols:
        lines.append("(%s %s of %d)" % (col_name, start if n == 1 else "%d-%d" % (
            start, start + n - 1), ncols))
      rule = "+" + "+".join("-" * (width + 2) for _ in range(n)) + "+"
      lines.append(rule)
      for row in rows:
        band = row[start:start + n]
        for i in range(max(len(c) for c in band)):
          lines.append("|" + "|".join(" %s " % (c[i] if i < len(c) else "").ljust(width)
                                      for c in band) + "|")
        lines.append(rule)
  return lines


def visualize_sharding(tensor_or_shape, mesh_impl=None, *, mesh_shape=None, layout=None,
                       max_width=100, stream=None):
  """Prints and returns a text picture of which slice of a tensor each processor holds.

  Example: a [batch:16, d_ff:128] weight under "batch:rows;d_ff:cols" on "rows:2;cols:4"
  draws a 2 x 4 grid whose cell for processor 5 (row 1, col 1) reads
  `p5 batch[8:16] d_ff[32:64]`. Processors holding the same slice (replicas) show the
  same slice text, and the legend counts the distinct slices and lists their holders.

  Args:
    tensor_or_shape: an mtf Tensor, an mtf Shape, or anything convert_to_shape accepts.
    mesh_impl: a MeshImpl (or MeshLayout), which carries the mesh shape and layout rules.
    mesh_shape, layout: instead of mesh_impl, a mesh shape and layout rules (None splits
      nothing).
    max_width: the widest line of the grid; a cell's text wraps, and columns that still
      do not fit are drawn in bands.
    stream: where to print; default sys.stdout.

  Returns:
    The picture, as a string (without a trailing newline).

  Raises:
    LayoutError: the layout cannot apply to the tensor (a split dim not divisible by its
      mesh dim, two dims on one mesh dim, a dim on two mesh dims), naming the tensor,
      the dim and the rule.
    ValueError, TypeError: no mesh, or both a mesh_impl and mesh_shape/layout.
  """
  view = _View(tensor_or_shape, mesh_impl, mesh_shape, layout)
  lines = [view.header(), view.mesh_line()] + view.notes()
  lines += _grid_lines([(title, [[view.cell_tokens(h) for h in row] for row in rows])
                        for title, rows in view.grids()],
                       max(int(max_width), 8), view.column_name())
  lines += view.legend()
  text = "\n".join(lines)
  print(text, file=stream if stream is not None else sys.stdout)
  return text


def plot_sharding(tensor_or_shape, mesh_impl=None, *, mesh_shape=None, layout=None,
                  ax=None):
  """Draws visualize_sharding's grid with matplotlib: one rectangle per processor, one
  color per distinct slice (replicas share a color), labelled like the text cells.

  Meshes of more than two dims are drawn flattened: each row is one coordinate of all
  mesh dims but the last (row-major), as the title says.

  ax: a matplotlib Axes to draw into (None makes a new figure); the other arguments are
  visualize_sharding's. Returns the matplotlib Figure; raises ImportError without
  matplotlib.
  """
  try:
    from matplotlib import colormaps  # pylint: disable=g-import-not-at-top
    from matplotlib.patches import Rectangle  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        "mtf.plot_sharding needs matplotlib, which is not installed: `pip install "
        "matplotlib` (the test extra mesh_tf[test] includes it); mtf.visualize_sharding "
        "draws the same picture as text without it") from e
  view = _View(tensor_or_shape, mesh_impl, mesh_shape, layout)
  mesh = view.layout.shape
  ncols = mesh[-1].size if mesh.ndims else 1
  nrows = len(view.holdings) // ncols
  if ax is None:
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    fig, ax = plt.subplots(figsize=(min(2.2 * ncols + 1, 24), min(1.2 * nrows + 1.2, 24)))
  else:
    fig = ax.figure
  cmap = colormaps["tab20" if view.num_slices <= 20 else "turbo"]
  font = max(4, min(10, 60 // max(ncols, 1), 40 // max(len(view.shape.dims), 1)))
  for h in view.holdings:
    row, col = divmod(h.pnum, ncols)
    color = cmap(h.slice_id % 20 if view.num_slices <= 20
                 else h.slice_id / max(view.num_slices - 1, 1))
    ax.add_patch(Rectangle((col, row), 1, 1, facecolor=color, edgecolor="black",
                           linewidth=1))
    ax.text(col + 0.5, row + 0.5, "\n".join(view.cell_tokens(h)), ha="center",
            va="center", fontsize=font)
  ax.set_xlim(0, ncols)
  ax.set_ylim(nrows, 0)  # row 0 at the top, as in the text picture
  ax.set_xticks([])
  ax.set_yticks([])
  if mesh.ndims:
    ax.set_xlabel("%s (%d)" % (mesh[-1].name, mesh[-1].size))
  if mesh.ndims >= 2:
    ax.set_ylabel(" x ".join("%s (%d)" % (m.name, m.size) for m in mesh.dims[:-1]) +
                  (" (flattened, row-major)" if mesh.ndims > 2 else ""))
  if mesh.ndims > 2:  # a thick line between the grids of the leading coordinates
    for k in range(1, nrows // mesh[-2].size):
      ax.axhline(k * mesh[-2].size, color="black", linewidth=3)
  title_chars = max(30, int(fig.get_figwidth() * ax.get_position().width * 11))
  ax.set_title(textwrap.fill(view.header(), title_chars) +
               "\n%d distinct slice%s on %d processors" % (
                   view.num_slices, "" if view.num_slices == 1 else "s",
                   len(view.holdings)), fontsize=9)
  return fig
