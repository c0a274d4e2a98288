"""Smoke test of benchmarks/decode_speed.py at a tiny size: every case decodes on one
device at two lengths, the table has a row per case with a per-position time per
length, and greedy cached ids equal the recompute path's. No timing assertions (the
machine is shared); the original library's side is not run here."""
import pytest
import tensorflow as tf

from benchmarks import decode_speed


def test_decode_speed_table_tiny_one_device():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  cases = list(decode_speed.CASES)
  rows, recompute_same, note, plain_same = decode_speed.run(
      "tiny", cases, ["1"], [16, 32], 32, prompt_length=4, repeats=1,
      devices=devices, original_python="")
  header, body = rows[0], rows[1:]
  assert header[:2] == ["case", "mesh"]
  assert "ms/pos @16" in header and "ms/pos @32" in header
  assert "max/min" in header and "tok/s @32" in header
  assert "ms/step @16" in header and "step max/min" in header
  assert [r[0] for r in body] == cases
  assert all(r[1] == "1 device" for r in body)
  # Columns timed directly are positive; "ms/step" subtracts two timings, so on a
  # loaded host it may come out at or below zero: only that it is a number is checked.
  derived = {i for i, h in enumerate(header) if h.startswith(("ms/step", "step max/min"))}
  for r in body:
    assert len(r) == len(header)
    assert all(float(x) > 0 for i, x in enumerate(r) if i >= 2 and i not in derived)
    assert all(float(r[i]) == float(r[i]) for i in derived)
  assert recompute_same is True
  assert plain_same is None  # plain TF's rows only when asked for
  assert "skipped" in note


def test_cache_layout_moves_memory_length_next_to_last():
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.transformer import decoding  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  dims = [mtf.Dimension(n, s) for n, s in
          (("batch", 2), ("memory_length", 5), ("heads", 3), ("d_kv", 4))]
  k = mtf.zeros(mesh, mtf.Shape(dims))
  assert [d.name for d in decoding._cache_layout(k).shape.dims] == [  # pylint: disable=protected-access
      "batch", "heads", "memory_length", "d_kv"]
  short = mtf.zeros(mesh, mtf.Shape(dims[:2]))
  assert decoding._cache_layout(short) is short  # pylint: disable=protected-access


@pytest.mark.parametrize("in_place", [False, True], ids=["scatter", "in_place"])
def test_write_at_position_writes_one_position(in_place):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.transformer import cache_write  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  b, h, m, d = (mtf.Dimension("batch", 2), mtf.Dimension("heads", 3),
                mtf.Dimension("memory_length", 5), mtf.Dimension("d_kv", 4))
  rng = np.random.RandomState(0)
  cache_np = rng.rand(2, 3, 5, 4).astype(np.float32)
  new_np = rng.rand(4, 2, 3).astype(np.float32)  # [d_kv, batch, heads]: any order
  imported = mtf.import_tf_tensor(mesh, tf.constant(cache_np), mtf.Shape([b, h, m, d]))
  new = mtf.import_tf_tensor(mesh, tf.constant(new_np), mtf.Shape([d, b, h]))
  cache = cache_write.private_copy(imported) if in_place else imported
  out = cache_write.write_at_position(cache, new, mtf.constant(mesh, 3, dtype=tf.int32),
                                      in_place=in_place)
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", [""])})
  want = cache_np.copy()
  want[:, :, 3, :] = new_np.transpose(1, 2, 0)
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(out).numpy(), want)
  # the write went into the private copy (in place) or a new tensor: the imported
  # value, read from the same lowering after the write, is unchanged
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(imported).numpy(), cache_np)


@pytest.mark.parametrize("backend", ["placement", "simd"])
def test_in_place_writes_only_where_each_slice_is_a_tensor(backend):
  """Traced on placement, an in_place write is one InplaceUpdate per device into a
  private copy; the SIMD emulation (which replays slice functions over stacked slices)
  keeps the functional scatter. Both write the same values."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.transformer import cache_write  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  b, m, d = (mtf.Dimension("batch", 4), mtf.Dimension("memory_length", 5),
             mtf.Dimension("d_kv", 3))
  cache_np = np.arange(60, dtype=np.float32).reshape(4, 5, 3)
  cache = cache_write.private_copy(
      mtf.import_tf_tensor(mesh, tf.constant(cache_np), mtf.Shape([b, m, d])))
  new = mtf.import_tf_tensor(mesh, -tf.ones([4, 3]), mtf.Shape([b, d]))
  out = cache_write.write_at_position(cache, new, mtf.constant(mesh, 2, dtype=tf.int32),
                                      in_place=True)
  devices = ["/cpu:%d" % i for i in range(2)]
  impl = (mtf.PlacementMeshImpl if backend == "placement" else mtf.SimdMeshImpl)(
      "rows:2", "batch:rows", devices)
  run = tf.function(lambda: mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(out))
  graph_def = run.get_concrete_function().graph.as_graph_def()
  ops = [n.op for n in graph_def.node] + [
      n.op for f in graph_def.library.function for n in f.node_def]
  if backend == "placement":
    assert ops.count("InplaceUpdate") == 2 and "TensorScatterUpdate" not in ops
  else:
    assert "InplaceUpdate" not in ops and "TensorScatterUpdate" in ops
  want = cache_np.copy()
  want[:, 2, :] = -1.0
  np.testing.assert_array_equal(run().numpy(), want)
