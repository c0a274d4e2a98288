"""benchmarks/roofline.py: its matmul inventory of the tiny LM step accounts for every
matmul FLOP of the step (an analytic count), on one device and per device of each
8-device layout, and a smoke run prints a row with a positive floor for every layout.
Nothing here is timed."""
import contextlib
import io
import re

import pytest
import tensorflow as tf

import mesh_tf as mtf
from benchmarks import roofline
from benchmarks import step_time
from models.tiny_lm import config, mtf_model

TINY = config.TinyLmConfig(**roofline.SIZES["tiny"])
LABELS = ["plain TF single"] + ["mesh_tf placement %s" % label
                                for label, _, _ in step_time.LAYOUTS]


@pytest.fixture(scope="module")
def smoke():
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    results = roofline.run("tiny", steps=1, repeats=1, backends=["placement"],
                           profile_steps=1, bandwidth_mb=4)
  return results, out.getvalue()


def test_flop_formulas():
  einsum = roofline.Matmul("Einsum", (("equation", "abc,cd->abd"),),
                           ((2, 3, 4), (4, 5)), "float32", "")
  bmm = roofline.Matmul("BatchMatMulV2", (("adj_x", True), ("adj_y", False)),
                        ((7, 1, 4, 3), (6, 4, 5)), "float32", "")
  assert roofline.matmul_flops(einsum) == 2 * 2 * 3 * 4 * 5
  assert roofline.matmul_flops(bmm) == 2 * 7 * 6 * 3 * 4 * 5  # broadcast batch 7 x 6


def test_inventory_holds_every_matmul_flop_per_device(smoke):
  results, _ = smoke
  assert [r["variant"] for r in results] == LABELS
  expected = roofline.analytic_matmul_flops(TINY)
  # plain TF: q, k, v, logits, attention, o, wi, wo per layer and the softmax, each
  # with its two gradients
  assert len(results[0]["inventory"]) == 3 * (8 * TINY.num_layers + 1)
  for r in results:
    devices = roofline.by_device(r["inventory"])
    assert len(devices) == (1 if r["layout"] == "single" else 8), r["variant"]
    # no matmul is replicated in these layouts: each device does its share
    for ops in devices.values():
      assert roofline.total_matmul_flops(ops) == expected / len(devices), r["variant"]


def test_simd_inventory_leaves_out_the_matmuls_tf_prunes():
  _, mesh_shape, layout = step_time.LAYOUTS[1]  # dp
  model = mtf_model.TinyLmModel(TINY)
  impl = mtf.make_mesh_impl("simd", mesh_shape, layout, ["/cpu:%d" % i for i in range(8)])
  batch = config.synthetic_batch(TINY)
  graph = roofline.step_graph(model.make_train_step(impl),
                              [tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])])
  expected = roofline.analytic_matmul_flops(TINY)
  # the SIMD step stacks the 8 devices' slices into one op: the whole step's FLOPs
  assert roofline.total_matmul_flops(roofline.matmul_inventory(graph)) == expected
  # its graph also holds weight gradients no output reads, which TF prunes
  every_op = roofline.matmul_inventory(graph, live_only=False)
  assert roofline.total_matmul_flops(every_op) > expected


def test_smoke_run_prints_a_row_per_layout_with_a_positive_floor(smoke):
  results, out = smoke
  for r in results:
    assert r["floor"] > 0 and r["step"] > 0, r["variant"]
  lines = out.splitlines()
  header = next(l for l in lines if l.startswith("variant ") and "floor s" in l)
  columns = re.split(r"\s{2,}", header)
  rows = [re.split(r"\s{2,}", l) for l in lines if l.startswith(tuple(LABELS))]
  # the main table and the profile each have one row per variant
  assert len(rows) == 2 * len(LABELS), out
  for row in rows[:len(LABELS)]:
    cells = dict(zip(columns, row))
    assert float(cells["floor s"]) > 0 and float(cells["step/floor"]) > 0, row
    assert float(cells["CPU floor s"]) > 0, row
  assert "profile unavailable" not in out
