"""Bad input to the GSPMD backend fails with a named MtfError before XLA sees anything."""
import collections

import pytest
import tensorflow as tf

import mesh_tf as mtf

import gspmd_models

FakeTpuAssignment = collections.namedtuple("FakeTpuAssignment", ["num_cores_per_replica"])


def test_device_assignment_of_the_wrong_size():
  with pytest.raises(mtf.LayoutError, match=r"8 processors.*3 devices"):
    mtf.GSPMDMeshImpl("rows:2;cols:4", "batch:rows", device_assignment=[0, 1, 2])


def test_tpu_device_assignment_with_other_core_count():
  with pytest.raises(mtf.LayoutError, match=r"rows:2;cols:4.*8 processors.*4 cores"):
    mtf.GSPMDMeshImpl("rows:2;cols:4", "", device_assignment=FakeTpuAssignment(4))
  impl = mtf.GSPMDMeshImpl("rows:2;cols:4", "", device_assignment=FakeTpuAssignment(8))
  assert impl.device_mesh.shape == (2, 4)


def test_device_assignment_repeating_a_device():
  with pytest.raises(mtf.LayoutError, match=r"permutation of 0\.\.7"):
    mtf.GSPMDMeshImpl("all:8", "", logical_to_physical=[0, 1, 2, 3, 4, 5, 6, 6])


def test_core_order_given_twice():
  with pytest.raises(mtf.LayoutError, match="not both"):
    mtf.GSPMDMeshImpl("all:8", "", device_assignment=list(range(8)),
                      logical_to_physical=list(range(8)))


def test_split_dim_not_divisible_fails_before_compilation():
  model = gspmd_models.build_mlp(hidden=6)  # 6 is not divisible by cols=4
  impl = mtf.GSPMDMeshImpl(gspmd_models.MESH_SHAPE, "hidden:cols")
  with pytest.raises(mtf.LayoutError, match=r"hidden=6.*cols.*hidden:cols") as info:
    gspmd_models.make_step(model, impl, jit_compile=True)
  assert info.value.dim == "hidden" and info.value.rule == "hidden:cols"


def test_illegal_layout_inside_a_jit_function_is_an_mtf_error():
  model = gspmd_models.build_mlp(batch=6)
  impl = mtf.GSPMDMeshImpl(gspmd_models.MESH_SHAPE, "batch:cols")

  @tf.function(jit_compile=True, autograph=False)
  def step(x, labels):
    lowering = mtf.Lowering(model.graph, {model.mesh: impl},
                            feeds={model.inputs[0][0]: x, model.inputs[1][0]: labels})
    return lowering.export_to_tf_tensor(model.loss)
  with pytest.raises(mtf.LayoutError, match=r"batch=6.*cols"):
    step.experimental_get_compiler_ir(*model.input_values())(stage="hlo")


def test_two_dims_on_one_mesh_dim():
  impl = mtf.GSPMDMeshImpl(gspmd_models.MESH_SHAPE, "batch:cols;hidden:cols")
  model = gspmd_models.build_mlp()
  with pytest.raises(mtf.LayoutError, match=r"batch and hidden.*cols"):
    mtf.Lowering(model.graph, {model.mesh: impl})
