"""Fixtures shared by the cluster tests."""
import pytest

import lm_cluster_helpers


@pytest.fixture(scope="session")
def local_lm(tmp_path_factory):
  """The toy LM's single-process run (lm_cluster_helpers.LocalLm), trained once for
  every test that compares a cluster run with it."""
  return lm_cluster_helpers.LocalLm(tmp_path_factory.mktemp("local_lm"))
