"""Fixtures shared by the cluster tests."""
import fcntl
import os

import pytest

import lm_cluster_helpers


@pytest.fixture(scope="session")
def local_lm(tmp_path_factory):
  """The toy LM's single-process run (lm_cluster_helpers.LocalLm), trained once for
  every test that compares a cluster run with it. Under pytest-xdist (which hands the
  test files that use it to different workers) the workers share one run: the first to
  need it trains it while holding a lock, and the others then read its files."""
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    return lm_cluster_helpers.LocalLm(tmp_path_factory.mktemp("local_lm"))
  directory = tmp_path_factory.getbasetemp().parent / "local_lm"  # this session's
  directory.mkdir(exist_ok=True)
  with open(directory / "lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lm_cluster_helpers.LocalLm(directory)
