"""visualize_sharding / plot_sharding: the picture names the slices the backends hold.

The slices are read back from the text (as a user would read it) and compared with what
PlacementMeshImpl really computes on each of the 8 virtual CPUs, and with the tiles of
the XLA sharding the GSPMD backend attaches.
"""
import io
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

_CELL_SLICE = re.compile(r"(\w+)\[(\d+):(\d+)\]")


def parse_picture(text):
  """{pnum: {dim name: (begin, end)}} from the grid cells of a picture (any band)."""
  held = {}
  block = []

  def flush():
    if not block:
      return
    columns = [" ".join(parts).split() for parts in zip(*block)]
    for words in columns:
      if not words:
        continue
      pnum = int(re.fullmatch(r"p(\d+)", words[0]).group(1))
      assert pnum not in held, "p%d drawn twice" % pnum
      held[pnum] = {m.group(1): (int(m.group(2)), int(m.group(3)))
                    for m in map(_CELL_SLICE.fullmatch, words[1:]) if m}
    del block[:]

  for line in text.splitlines():
    if line.startswith("+"):
      flush()
    elif line.startswith("|"):
      block.append([c.strip() for c in line.strip("|").split("|")])
  flush()
  return held


def _placement_slices(mesh_shape, layout, batch=8, d_model=4, d_ff=16):
  """Lowers y = einsum(x, w) on 8 virtual CPUs; returns (y's full value, y's per-processor
  slices with their devices, the picture of y)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x_np = np.arange(batch * d_model, dtype=np.float32).reshape(batch, d_model)
  w_np = np.random.RandomState(0).randn(d_model, d_ff).astype(np.float32)
  b, m, f = (mtf.Dimension("batch", batch), mtf.Dimension("d_model", d_model),
             mtf.Dimension("d_ff", d_ff))
  x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [b, m])
  w = mtf.import_tf_tensor(mesh, tf.constant(w_np), [m, f])
  y = mtf.einsum([x, w], output_shape=[b, f], name="ff")
  n = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.PlacementMeshImpl(mesh_shape, layout, ["/cpu:%d" % i for i in range(n)])
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(y)  # lowers y
  slices = lowering.tensors[y].tensor_list
  picture = mtf.visualize_sharding(y, impl, stream=io.StringIO())
  return x_np @ w_np, slices, picture


BACKEND_CASES = [
    ("rows:2;cols:4", ""),                      # replicated
    ("rows:2;cols:4", "batch:rows"),            # data parallel
    ("rows:2;cols:4", "d_ff:cols"),             # model parallel
    ("rows:2;cols:4", "batch:rows;d_ff:cols"),  # both
    ("rows:2;cols:4", "batch:cols;d_ff:rows"),  # both, transposed
    ("all:8", "batch:all"),
    ("all:8", "d_ff:all"),
    ("a:2;b:2;c:2", "batch:c;d_ff:a"),          # 3-D mesh, replicated over b
]


@pytest.mark.parametrize("mesh_shape,layout", BACKEND_CASES)
def test_picture_names_the_slices_placement_holds(mesh_shape, layout):
  full, slices, picture = _placement_slices(mesh_shape, layout)
  held = parse_picture(picture)
  assert sorted(held) == list(range(8))
  distinct = {tuple(sorted(r.items())) for r in held.values()}
  for pnum, tensor in enumerate(slices):
    if len(distinct) == 8:  # (replicas on host CPUs share one computed tensor)
      assert tensor.device.endswith("CPU:%d" % pnum)  # processor p is device p
    ranges = held[pnum]
    assert list(ranges) == ["batch", "d_ff"]
    expected = full[ranges["batch"][0]:ranges["batch"][1], ranges["d_ff"][0]:ranges["d_ff"][1]]
    np.testing.assert_allclose(tensor.numpy(), expected, rtol=1e-5)
  # the distinct slices named are as many as the backend's distinct values
  assert len({t.numpy().tobytes() for t in slices}) == len(distinct)
  assert "%d distinct slice" % len(distinct) in picture


@pytest.mark.parametrize("max_width", [30, 60, 100, 200])
def test_narrow_pictures_wrap_and_band_but_name_the_same_slices(max_width):
  kwargs = dict(mesh_shape="rows:2;cols:4", layout="batch:rows;d_ff:cols",
                stream=io.StringIO())
  shape = "batch:16;length:32;d_ff:128"
  wide = parse_picture(mtf.visualize_sharding(shape, max_width=1000, **kwargs))
  text = mtf.visualize_sharding(shape, max_width=max_width, **kwargs)
  assert parse_picture(text) == wide
  grid = [l for l in text.splitlines() if l[:1] in "+|"]
  assert max(len(l) for l in grid) <= max(max_width, len("| length[0:32] |"))


def _weight(name="w_in"):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  return mtf.get_variable(mesh, name, [mtf.Dimension("d_model", 64),
                                       mtf.Dimension("d_ff", 128)])


def test_header_says_what_is_split_and_replicated():
  w = _weight()
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;d_ff:cols")
  out = io.StringIO()
  text = mtf.visualize_sharding(w, impl, stream=out)
  assert out.getvalue() == text + "\n"
  lines = text.splitlines()
  assert lines[0] == ("f32 w_in [d_model:64, d_ff:128], d_ff split over cols (4); "
                      "replicated over rows (2)")
  assert lines[1] == ("mesh rows:2;cols:4 (8 processors), layout \"batch:rows;d_ff:cols\"; "
                      "grid: rows down, cols across")
  # the same picture from mesh_shape + layout (in any accepted spelling)
  assert mtf.visualize_sharding(w, mesh_shape=[("rows", 2), ("cols", 4)],
                                layout={"batch": "rows", "d_ff": "cols"},
                                stream=io.StringIO()) == text
  # replicas: the processors of one column hold the same slice, and the legend says so
  held = parse_picture(text)
  for p in range(4):
    assert held[p] == held[p + 4] == {"d_model": (0, 64), "d_ff": (32 * p, 32 * p + 32)}
  assert "4 distinct slices, each held by 2 processors" in text
  assert "  d_model[0:64] d_ff[32:64]: p1 p5" in lines


def test_headers_of_other_layouts():
  kw = dict(stream=io.StringIO())
  assert mtf.visualize_sharding("batch:16;d:8", mesh_shape="rows:2;cols:4", **kw).startswith(
      "[batch:16, d:8], replicated on all 8 processors (rows:2 x cols:4)\n")
  both = mtf.visualize_sharding("batch:16;d:8", mesh_shape="rows:2;cols:4",
                                layout="batch:rows;d:cols", **kw)
  assert both.startswith("[batch:16, d:8], batch split over rows (2), d split over cols (4)\n")
  assert "8 distinct slices, one per processor" in both
  single = mtf.visualize_sharding("batch:16", mesh_shape="", layout="batch:rows", **kw)
  assert single.splitlines()[0] == "[batch:16], on a single processor"
  assert parse_picture(single) == {0: {"batch": (0, 16)}}
  # a rule for this tensor's dim on a mesh dim the mesh lacks (a typo?) is pointed out
  assert ("note: rule batch:row names mesh dim \"row\", which mesh rows:2;cols:4 lacks"
          in mtf.visualize_sharding("batch:16", mesh_shape="rows:2;cols:4",
                                    layout="batch:row", **kw))
  three = mtf.visualize_sharding("batch:16", mesh_shape="a:2;b:2;c:2", layout="batch:b", **kw)
  assert "one grid per a" in three and "\na=0:\n" in three and "\na=1:\n" in three


def test_bad_layouts_raise_the_librarys_errors():
  w = _weight()
  with pytest.raises(mtf.LayoutError) as e:  # 128 is not divisible by 3
    mtf.visualize_sharding(w, mesh_shape="rows:2;cols:3", layout="d_ff:cols",
                           stream=io.StringIO())
  assert 'tensor "w_in:0"' in str(e.value) and "d_ff=128" in str(e.value)
  assert "rule \"d_ff:cols\"" in str(e.value) and "3 does not divide 128" in str(e.value)
  assert (e.value.tensor, e.value.dim, e.value.rule) == ("w_in:0", "d_ff", "d_ff:cols")
  with pytest.raises(mtf.LayoutError, match="split over several mesh dims"):
    mtf.visualize_sharding(w, mesh_shape="rows:2;cols:4", layout="d_ff:rows;d_ff:cols",
                           stream=io.StringIO())
  with pytest.raises(mtf.LayoutError, match="both split over mesh dim \"cols\""):
    mtf.visualize_sharding(w, mesh_shape="rows:2;cols:4", layout="d_model:cols;d_ff:cols",
                           stream=io.StringIO())
  with pytest.raises(mtf.LayoutError, match="cannot parse layout rules"):
    mtf.visualize_sharding(w, mesh_shape="rows:2", layout="d_ff", stream=io.StringIO())
  with pytest.raises(ValueError, match="needs a mesh"):
    mtf.visualize_sharding(w)
  with pytest.raises(ValueError, match="not both"):
    mtf.visualize_sharding(w, mtf.PlacementMeshImpl("rows:2", ""), layout="d_ff:rows")
  with pytest.raises(TypeError, match="mesh_shape=... and layout="):
    mtf.visualize_sharding(w, "rows:2;cols:4")


def test_picture_matches_the_xla_sharding_gspmd_attaches():
  """GSPMD's values are whole, but XLA tiles them by the layout: device d (= processor d)
  holds the tile at its position in the OpSharding's tile assignment."""
  shape = mtf.convert_to_shape("batch:8;length:4;d_ff:16")
  for layout in ["batch:rows;d_ff:cols", "d_ff:rows", "length:cols"]:
    impl = mtf.GSPMDMeshImpl("rows:2;cols:4", layout)
    held = parse_picture(mtf.visualize_sharding(shape, impl, stream=io.StringIO()))
    proto = impl.sharding_of(shape)
    tiles = list(proto.tile_assignment_dimensions)
    for i, device in enumerate(proto.tile_assignment_devices):
      tile = np.unravel_index(i, tiles)[:shape.ndims]
      expected = {d.name: (t * d.size // n, (t + 1) * d.size // n)
                  for d, t, n in zip(shape.dims, tile, tiles)}
      assert held[device] == expected, (layout, device)


def _pyplot():
  import matplotlib  # the test extra installs it; pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def test_plot_sharding_draws_one_patch_per_processor():
  plt = _pyplot()
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = mtf.plot_sharding(_weight(), mesh_shape="rows:2;cols:4", layout="d_ff:cols")
  try:
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert len(ax.patches) == 8
    # one color per distinct slice: 4 (replicated over rows), the same down each column
    colors = [tuple(p.get_facecolor()) for p in ax.patches]
    assert len(set(colors)) == 4 and colors[:4] == colors[4:]
    labels = [t.get_text() for t in ax.texts]
    assert "p5\nd_model[0:64]\nd_ff[32:64]" in labels
    assert ax.get_title().startswith("f32 w_in [d_model:64, d_ff:128], d_ff split over cols")
  finally:
    plt.close(fig)
  fig, ax = plt.subplots()
  try:  # into a given Axes; a 3-D mesh is flattened to rows
    assert mtf.plot_sharding("batch:16", mesh_shape="a:2;b:2;c:2", layout="batch:a",
                             ax=ax) is fig
    assert len(ax.patches) == 8 and len({tuple(p.get_facecolor()) for p in ax.patches}) == 2
    assert "flattened" in ax.get_ylabel()
  finally:
    plt.close(fig)


def test_plot_sharding_without_matplotlib_says_how_to_get_it(monkeypatch):
  for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
  with pytest.raises(ImportError, match="pip install matplotlib"):
    mtf.plot_sharding("batch:16", mesh_shape="rows:2", layout="batch:rows")


def test_the_readme_picture_is_what_visualize_sharding_prints():
  with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as f:
    readme = f.read()
  start = readme.index("  f32 w [batch:16, d_ff:128]")
  block = readme[start:readme.index("```", start)]
  quoted = "\n".join(line[2:] for line in block.rstrip().splitlines())
  graph = mtf.Graph()
  w = mtf.get_variable(mtf.Mesh(graph, "m"), "w", [mtf.Dimension("batch", 16),
                                                   mtf.Dimension("d_ff", 128)])
  assert mtf.visualize_sharding(w, mesh_shape="rows:2;cols:4", layout="batch:rows;d_ff:cols",
                                stream=io.StringIO()) == quoted
