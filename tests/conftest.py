"""Test session set-up: 8 virtual CPU devices, configured once before TF initializes."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_VIRTUAL_DEVICES = 8


from mesh_tf import utils  # pylint: disable=g-import-not-at-top,wrong-import-position

utils.configure_virtual_cpus(NUM_VIRTUAL_DEVICES)


def pytest_configure(config):
  # Tests that run XLA's SPMD partitioner through jax/jaxlib (the test extra installs
  # them on Python >= 3.11 only; such modules skip below 3.11). `-m "not jax"` leaves
  # them out.
  config.addinivalue_line("markers", "jax: needs jax/jaxlib (Python >= 3.11)")


# ---------------------------------------------------- shared mesh/layout test matrix
import collections  # pylint: disable=g-import-not-at-top,wrong-import-position

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

import mesh_tf as mtf  # pylint: disable=g-import-not-at-top,wrong-import-position

MeshCase = collections.namedtuple("MeshCase", ["mesh_shape", "layout"])

# Every op test runs on each of these (mesh shape, layout rules) pairs. Tests name their
# dims "batch" and "hidden" (size divisible by 8) so every rule applies.
MESH_LAYOUT_CASES = [
    MeshCase("", ""),
    MeshCase("all:8", ""),
    MeshCase("all:8", "batch:all"),
    MeshCase("all:8", "hidden:all"),
    MeshCase("rows:2;cols:4", ""),
    MeshCase("rows:2;cols:4", "batch:rows"),
    MeshCase("rows:2;cols:4", "hidden:cols"),
    MeshCase("rows:2;cols:4", "batch:rows;hidden:cols"),
]


def mesh_case_id(case):
  """Readable test id, e.g. "mesh=2x4/layout=batch:rows;hidden:cols"."""
  sizes = mtf.convert_to_shape(case.mesh_shape).to_integer_list
  mesh = "x".join(str(s) for s in sizes) if sizes else "single"
  return "mesh=%s/layout=%s" % (mesh, case.layout or "empty")


def build_mesh_impl(case):
  """A PlacementMeshImpl for a MeshCase on the first N virtual CPU devices."""
  n = mtf.convert_to_shape(case.mesh_shape).size
  return mtf.PlacementMeshImpl(case.mesh_shape, case.layout,
                               ["/cpu:%d" % i for i in range(n)])


@pytest.fixture(params=MESH_LAYOUT_CASES, ids=mesh_case_id)
def mesh_case(request):
  """Each (mesh shape, layout) case of MESH_LAYOUT_CASES in turn."""
  return request.param


@pytest.fixture
def mesh_impl(mesh_case):  # pylint: disable=redefined-outer-name
  """A fresh PlacementMeshImpl for the current case (fresh variables and rng counter)."""
  return build_mesh_impl(mesh_case)


@pytest.fixture
def make_mesh_impl():
  """Factory fixture: build_mesh_impl(MeshCase(mesh_shape, layout))."""
  return lambda mesh_shape="", layout="": build_mesh_impl(MeshCase(mesh_shape, layout))
