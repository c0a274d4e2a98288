"""Test session set-up: 8 virtual CPU devices, configured once before TF initializes."""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One intra-op thread in every test process and every subprocess they start (the variable
# is inherited): the suite runs three pytest workers and their trainer subprocesses on two
# cores, where TF's default intra-op pool of one thread per core spins while it waits for
# work that another process's threads are doing. On the cluster and trainer-subprocess
# tests this cut the CPU-seconds by about a tenth; no test times anything, and every
# process of a test computes with the same setting.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
# XLA's CPU code generation without LLVM's optimization passes, in every test process
# and subprocess: the XLA tests check partitioning, memory and numbers, which come from
# the HLO passes that still run, and compiling took about a third of their CPU-seconds
# (test_trainer_gspmd.py: 56 -> 40). Benchmarks, run outside the suite, keep the default.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_backend_optimization_level=0").strip()

import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_VIRTUAL_DEVICES = 8


from mesh_tf import utils  # pylint: disable=g-import-not-at-top,wrong-import-position

utils.configure_virtual_cpus(NUM_VIRTUAL_DEVICES)

# Python's cyclic collector in the test processes: TensorFlow's modules (imported above)
# left out of every collection, and a young generation 70x the default. Tracing a step
# allocates millions of short-lived objects, and each collection walked the whole
# TensorFlow object graph: about 5-8% of an in-process trainer test's CPU-seconds.
# Cyclic garbage is still collected, later.
import gc  # pylint: disable=g-import-not-at-top,wrong-import-position
gc.freeze()
gc.set_threshold(50000, 20, 10)


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Python subprocesses started by tests (trainers, SPMD peers, cluster workers, benchmarks)
# import TensorFlow without the test extra's jax, matplotlib and IPython, which nothing
# they run uses: tests/lean_site/sitecustomize.py hides the modules named here (about 2 of
# the 7 CPU-seconds of each such start). A test whose subprocess needs one of them (the
# jaxlib partitioner, the notebook kernel) drops HIDDEN_MODULES_VAR from that
# subprocess's environment.
LEAN_SITE = os.path.join(REPO_ROOT, "tests", "lean_site")
HIDDEN_MODULES_VAR = "MESH_TF_TEST_HIDDEN_MODULES"
HIDDEN_MODULES = "jax,jaxlib,matplotlib,IPython"


@pytest.fixture(scope="session", autouse=True)
def lean_subprocesses():
  """Puts this repository and tests/lean_site first on the PYTHONPATH of every subprocess
  this test process starts, with HIDDEN_MODULES hidden there. A fixture, not module code:
  under xdist it then runs in the workers only, never in the controller, whose
  environment the workers (which run the jax tests in-process) inherit."""
  saved = {k: os.environ.get(k) for k in ("PYTHONPATH", HIDDEN_MODULES_VAR)}
  os.environ["PYTHONPATH"] = os.pathsep.join(
      [REPO_ROOT, LEAN_SITE] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
  os.environ[HIDDEN_MODULES_VAR] = HIDDEN_MODULES
  yield
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


# The dearest test files (CPU-seconds in a full run with MTF_TEST_CPU_LOG,
# 2026-12-05 16:08), dearest first. They are collected first so that `--dist loadfile` hands them out early
# and the workers end together, instead of one worker starting a long file while the other is idle. The
# Makefile passes --no-loadscope-reorder: xdist otherwise sorts files by their number of
# tests, which put the few-test, slow cluster files last.
HEAVY_FILES = [
    "tests/test_benchmarks_run.py",
    "tests/transformer/trainer/test_orig_model_files_train.py",
    "tests/cluster/test_spmd_peer_faults.py",
    "tests/cluster/test_placement_cluster.py",
    "tests/transformer/decoding/test_cached_decoding.py",
    "tests/cluster/test_spmd_trainer.py",
    "tests/analysis/test_memory_measured.py",
    "tests/transformer/layers/test_remat_memory.py",
    "tests/cluster/test_spmd_cluster.py",
    "tests/transformer/layers/test_modules_universal_transformer.py",
    "tests/cluster/test_spmd_exact_resume.py",
    "tests/transformer/decoding/test_zoo_cached_decoding.py",
    "tests/transformer/trainer/test_trainer_processes.py",
    "tests/backends/gspmd/test_colab_notebook.py",
    "tests/backends/test_conformance.py",
    "tests/transformer/trainer/test_trainer_gspmd.py",
    "tests/backends/tpu_contract/test_tpu_primitives.py",
    "tests/transformer/trainer/test_bf16_training.py",
    "tests/transformer/trainer/test_trainer_reliability.py",
    "tests/transformer/trainer/test_gin_configs.py",
    "tests/transformer/trainer/test_entry_points.py",
    "tests/cluster/test_tpu_distribution.py",
    "tests/transformer/trainer/test_read_while_pruning.py",
    "tests/transformer/trainer/test_trainer_seq2seq.py",
    "tests/properties/test_layout_independence.py",
    "tests/transformer/layers/test_modules_gin_training.py",
]


def pytest_collection_modifyitems(items):
  """Moves HEAVY_FILES' tests to the front, in that order; the rest keep theirs."""
  rank = {path: i for i, path in enumerate(HEAVY_FILES)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """With MTF_TEST_CPU_LOG=<file>, appends each test's CPU seconds (this process and the
  subprocesses it waited for) to that file: the suite's budget is CPU on 2 cores, and
  wall-clock durations hide what a subprocess costs the other worker."""
  path = os.environ.get("MTF_TEST_CPU_LOG")
  if not path:
    yield
    return
  import resource  # pylint: disable=g-import-not-at-top

  def cpu():
    return sum(r.ru_utime + r.ru_stime for r in (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN)))
  start = cpu()
  yield
  with open(path, "a") as f:
    f.write("%.2f %s\n" % (cpu() - start, item.nodeid))


def pytest_configure(config):
  # Tests that run XLA's SPMD partitioner through jax/jaxlib (the test extra installs
  # them on Python >= 3.11 only; such modules skip below 3.11). `-m "not jax"` leaves
  # them out.
  config.addinivalue_line("markers", "jax: needs jax/jaxlib (Python >= 3.11)")


# ---------------------------------------------------- shared mesh/layout test matrix
import collections  # pylint: disable=g-import-not-at-top,wrong-import-position


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
