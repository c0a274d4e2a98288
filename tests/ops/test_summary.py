"""Reporting (mesh_tf/ops/summary.py): scalar_summary, log_variable_sizes,
pretty_print_counters."""
import io
import logging

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, new_mesh, random_array


def _summary_graph():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array([BATCH, HIDDEN], 0), [BATCH, HIDDEN])
  op = mtf.scalar_summary("loss", mtf.reduce_mean(x))
  return graph, mesh, op


def _events(logdir):
  files = tf.io.gfile.glob(logdir + "/events.*")
  assert len(files) == 1
  out = []
  for record in tf.data.TFRecordDataset(files[0]):
    event = tf.compat.v1.Event.FromString(record.numpy())
    for v in event.summary.value:
      out.append((event.step, v.tag, tf.make_ndarray(v.tensor),
                  v.metadata.plugin_data.plugin_name))
  return out


def test_scalar_summary_writes_the_value(make_mesh_impl, tmp_path):
  graph, mesh, op = _summary_graph()
  assert isinstance(op, mtf.ScalarSummaryOperation)
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  writer = tf.summary.create_file_writer(str(tmp_path))
  with writer.as_default(step=7):
    value = mtf.Lowering(graph, {mesh: impl}).lowered_operation(op)
  writer.flush()
  expected = random_array([BATCH, HIDDEN], 0).mean()
  np.testing.assert_allclose(value.numpy(), expected, atol=1e-6)
  [(step, tag, logged, plugin)] = _events(str(tmp_path))
  assert (step, tag, plugin) == (7, "loss", "scalars")
  np.testing.assert_allclose(logged, expected, atol=1e-6)


def test_scalar_summary_without_writer_and_errors(make_mesh_impl, tmp_path):
  graph, mesh, op = _summary_graph()
  value = mtf.Lowering(graph, {mesh: make_mesh_impl()}).lowered_operation(op)
  np.testing.assert_allclose(value.numpy(), random_array([BATCH, HIDDEN], 0).mean(),
                             atol=1e-6)
  with pytest.raises(mtf.ShapeError, match="reduce it first"):
    mtf.scalar_summary("bad", mtf.zeros(mesh, [BATCH]))
  tf.summary.experimental.set_step(None)
  with tf.summary.create_file_writer(str(tmp_path)).as_default():
    with pytest.raises(mtf.MtfError, match="scalar_summary 'loss'.*set_step"):
      mtf.Lowering(graph, {mesh: make_mesh_impl()}).lowered_operation(op)


def test_log_variable_sizes(make_mesh_impl, caplog):
  graph, mesh = new_mesh()
  mtf.get_variable(mesh, "w", [BATCH, HIDDEN])
  mtf.get_variable(mesh, "b", [HIDDEN])
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  log_file = io.StringIO()
  with caplog.at_level(logging.INFO, logger="mesh_tf"):
    total = mtf.log_variable_sizes(graph.trainable_variables, "Params",
                                   mesh_to_impl={mesh: impl}, log_file=log_file)
  assert total == 72
  lines = log_file.getvalue().splitlines()
  assert lines[0].startswith("Weight    b") and "slice_size 2" in lines[0]
  assert "size    64" in lines[1] and "slice_size 8" in lines[1]
  assert lines[2] == "Params count: 2  Total size: 72  Total slice_size: 10"
  assert caplog.messages == lines
  assert mtf.log_variable_sizes([], "none") == 0


def test_pretty_print_counters():
  text = mtf.pretty_print_counters([("einsum", 1000), ("comm/allreduce", 30),
                                    ("comm/allconcat", 12.5), ("comm/allreduce", 2)])
  assert text.splitlines() == ["comm: 44.5", " comm/allconcat: 12.5",
                               " comm/allreduce: 32", "einsum: 1e+03"]
  assert mtf.pretty_print_counters({"a/b/c": 2}) == "a: 2\n a/b: 2\n  a/b/c: 2"
