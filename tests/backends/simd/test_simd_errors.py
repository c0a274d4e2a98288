"""Bad SIMD meshes, core maps and tilings raise LayoutError naming what is wrong."""
import pytest

import mesh_tf as mtf
from mesh_tf.simd_mesh_impl import HierarchicalTiling, auto_logical_to_physical_tpu


class _FakeAssignment:
  num_replicas = 4


def test_device_assignment_of_another_size():
  with pytest.raises(mtf.LayoutError, match=r"rows:2;cols:4.*8 cores.*4 replicas"):
    mtf.SimdMeshImpl("rows:2;cols:4", "", device_assignment=_FakeAssignment())


def test_devices_of_another_size():
  with pytest.raises(mtf.LayoutError, match=r"a:8.*8 cores but 3 devices"):
    mtf.SimdMeshImpl("a:8", "", devices=["/cpu:0"] * 3)


def test_logical_to_physical_not_a_permutation():
  with pytest.raises(mtf.LayoutError, match=r"a:4.*not a permutation.*repeated \[1\]"):
    mtf.SimdMeshImpl("a:4", "", logical_to_physical=[0, 1, 1, 3])
  with pytest.raises(mtf.LayoutError, match=r"a:4.*has 3 entries.*4 cores"):
    mtf.SimdMeshImpl("a:4", "", logical_to_physical=[0, 1, 2])
  with pytest.raises(mtf.LayoutError, match=r"out of range \[7\]"):
    mtf.SimdMeshImpl("a:4", "", logical_to_physical=[0, 1, 2, 7])


def test_tiling_spec_that_does_not_tile():
  with pytest.raises(mtf.LayoutError, match=r"does not tile the physical shape \[4, 4\]"):
    HierarchicalTiling([("x", [2, 2]), ("y", [2, 1])], [4, 4])
  with pytest.raises(mtf.LayoutError, match=r"physical axis 1 \(size 4\).*divisible by 3"):
    HierarchicalTiling([("x", None), ("y", [1, 3])], [4, 4])
  with pytest.raises(mtf.LayoutError, match=r"'y' projects onto 3 physical axes"):
    HierarchicalTiling([("x", None), ("y", [1, 1, 2])], [4, 4])
  with pytest.raises(mtf.LayoutError, match=r"covers 8 processors, not 16"):
    HierarchicalTiling.spec_to_mesh_shape([("x", [2, 2]), ("y", [2, 1])], 16)


def test_auto_map_of_another_size():
  with pytest.raises(mtf.LayoutError, match=r"logical mesh \[4, 4\] has 16.*\[2, 2, 1, 2\] "
                                            r"has 8"):
    auto_logical_to_physical_tpu([4, 4], [2, 2, 1, 2])


def test_emulated_laid_out_tensor_holds_one_stacked_tensor():
  impl = mtf.SimdMeshImpl("a:2", "")
  with pytest.raises(mtf.LayoutError, match="one stacked tensor.*list of 2"):
    impl.LaidOutTensor([1, 2])
