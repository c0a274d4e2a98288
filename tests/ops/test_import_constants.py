"""Known small imports (the Python numbers of `x * 2.0`, numpy arrays) are emitted as
constants: once per traced graph for each distinct value, cut per slice, and still right
inside a tf.cond branch that reuses a value of the outer graph."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models import train_steps
from tests import mtf_testing

BATCH = mtf.Dimension("batch", 8)
HIDDEN = mtf.Dimension("hidden", 4)
CASES = [("placement", "", ""), ("placement", "all:8", "batch:all"),
         ("simd", "rows:2;cols:4", "batch:rows;hidden:cols")]


def _consts_with_value(graph, value):
  """Const ops holding the one number `value` (any shape of size 1: SIMD's are [1, 1])."""
  arrays = [(op, tf.make_ndarray(op.get_attr("value"))) for op in graph.get_operations()
            if op.type == "Const"]
  return [op for op, a in arrays if a.size == 1 and a.dtype == np.float32 and
          float(a.reshape(())) == value]


@pytest.mark.parametrize("backend,mesh_shape,layout", CASES)
def test_equal_scalars_share_one_constant(backend, mesh_shape, layout):
  graph, mesh = mtf_testing.new_mesh()
  x = mtf.import_tf_tensor(mesh, tf.TensorSpec([8, 4]), [BATCH, HIDDEN], name="x")
  y = (x * 2.5 + 2.5) * 2.5
  table = np.arange(32, dtype=np.float32).reshape(8, 4)
  z = y + mtf.import_tf_tensor(mesh, table, [BATCH, HIDDEN])
  impl = mtf_testing.backend_mesh_impl(backend, mesh_shape, layout)
  value = np.random.RandomState(0).randn(8, 4).astype(np.float32)

  @tf.function
  def run(v):
    return mtf.Lowering(graph, {mesh: impl}, feeds={x: v}).export_to_tf_tensor(z)
  np.testing.assert_allclose(run(value).numpy(), (value * 2.5 + 2.5) * 2.5 + table,
                             rtol=1e-6)
  fn_graph = run.get_concrete_function(value).graph
  # Placement on CPUs of this process shares one constant between the devices holding
  # the same slice (PlacementMeshImpl.shares_memory); SIMD stores one per distinct slice.
  per_device = 1
  assert len(_consts_with_value(fn_graph, 2.5)) == per_device


def test_value_shared_between_outer_graph_and_cond_branch():
  graph, mesh = mtf_testing.new_mesh()
  v = mtf.get_variable(mesh, "v", [BATCH], initializer=tf.ones_initializer())
  loss = mtf.reduce_sum(v * 3.0)
  update = mtf.assign(v, v * 3.0)
  impl = mtf_testing.backend_mesh_impl("placement", "all:8", "batch:all")
  mtf.Lowering(graph, {mesh: impl})  # creates the variable eagerly

  @tf.function
  def step():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return train_steps.lower_train_step(lowering, loss, [update], skip_nonfinite=True)
  assert float(step()) == pytest.approx(24.0)
  assert float(step()) == pytest.approx(72.0)  # the update inside the cond ran
