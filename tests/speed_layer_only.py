"""Tests of the speed layer itself (mesh_tf/lowering/speed_layer.py): what it defers,
records, replays or makes directly, and the op counts that follow. They are skipped
where the layer is off (MESH_TF_SPEED_LAYER=0, or TF lacking an internal it needs); every
other test must pass either way. The conftest.py of each test folder below asks here."""
import pytest

# node ids (a file, or a file::test prefix) that test the speed layer itself
SPEED_LAYER_TESTS = (
    "tests/lowering/test_direct_ops.py",
    "tests/backends/placement/test_placement_slice_replay.py",
    "tests/backends/placement/test_placement_slice_segments.py",
    "tests/backends/simd/test_simd_trace_reuse.py",
    # the replay keeps replicated values compact and fuses an allreduce into an einsum
    "tests/backends/simd/test_simd_compact.py::test_slicewise_broadcasts_extents_like_numpy",
    "tests/backends/simd/test_simd_compact.py::test_allreduce_of_an_einsum_contracts_inside",
    # at 512 cores the layer's vectorizer writes a transpose as one reshape
    "tests/backends/simd/test_simd_lm_scaling.py::test_lm_step_at_512_cores_writes_some",
    # the op-count bounds are what the layer saves
    "tests/backends/test_op_counts.py::test_placement_one_device_op_count_is_bounded",
    "tests/backends/test_op_counts.py::test_simd_op_count_is_bounded_and_independent_of",
    "tests/backends/test_op_counts.py::test_placement_eight_devices_op_count_is_bounded",
)

_off = None


def skip_if_off(node):
  """Skips node where it tests the speed layer and the layer is off."""
  global _off
  if not node.nodeid.startswith(SPEED_LAYER_TESTS):
    return
  if _off is None:
    from mesh_tf.lowering import speed_layer  # pylint: disable=g-import-not-at-top
    _off = not speed_layer.enabled()
  if _off:
    pytest.skip("tests the speed layer, which is off (MESH_TF_SPEED_LAYER=0 or TF "
                "lacks an internal it needs)")
