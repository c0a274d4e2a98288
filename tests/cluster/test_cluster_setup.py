"""The trainer's cluster roles from --cluster, gin and TF_CONFIG (no processes)."""
import json

import gin
import pytest

from mesh_tf import cluster
from models.transformer.trainer import cluster_setup


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  gin.clear_config()
  yield
  gin.clear_config()
  cluster_setup.configure()  # back to one process for later tests


def test_one_process_without_cluster():
  assert cluster_setup.configure() == ("single", None, 0)
  assert cluster_setup.mesh_devices("batch:2;model:4", "placement") is None


def test_flag_and_gin_make_this_process_the_chief():
  assert cluster_setup.configure("a:1,b:2") == ("chief", ["a:1", "b:2"], 0)
  gin.parse_config("cluster_setup.cluster_config.cluster = 'c:3,d:4'")
  assert cluster_setup.configure() == ("chief", ["c:3", "d:4"], 0)
  assert cluster_setup.configure("a:1") == ("chief", ["a:1"], 0)  # the flag wins


@pytest.mark.parametrize("task, role", [({"type": "worker", "index": 1}, "worker"),
                                        ({"type": "chief", "index": 0}, "chief")])
def test_tf_config_gives_the_role(monkeypatch, task, role):
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": {"worker": ["a:1", "b:2"], "chief": ["c:3"]}, "task": task}))
  assert cluster_setup.configure() == (role, ["a:1", "b:2"], task["index"])


def test_cluster_needs_the_placement_backend():
  cluster_setup.configure("a:1,b:2")
  with pytest.raises(cluster.ClusterError, match="backend = 'placement'"):
    cluster_setup.mesh_devices("batch:2;model:4", "simd")


def test_uneven_worker_split_is_refused_before_serving():
  with pytest.raises(cluster.ClusterError, match="cannot be split evenly over 3"):
    cluster_setup.serve(["a:1", "b:2", "c:3"], 0, "batch:2,model:4")


def test_run_in_role_runs_alone_or_names_a_lost_worker():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import cluster_helpers  # pylint: disable=g-import-not-at-top
  assert cluster_setup.run_in_role(None, lambda: "ran") == "ran"
  port, = cluster_helpers.free_ports(1)  # nobody listens: the worker is gone

  def step_fails():
    raise tf.errors.UnavailableError(None, None, "Socket closed")
  with cluster_helpers.local_listener() as live:
    with pytest.raises(cluster.ClusterError, match="lost worker task 1 ") as info:
      cluster_setup.run_in_role("%s,localhost:%d" % (live, port), step_fails)
    assert info.value.task == 1
    with pytest.raises(ValueError, match="not a cluster failure"):  # passed through
      cluster_setup.run_in_role(live, lambda: (_ for _ in ()).throw(
          ValueError("not a cluster failure")))


def test_spmd_mode_is_checked_before_anything_starts():
  from models.transformer import utils  # pylint: disable=g-import-not-at-top,unused-import
  gin.parse_config("cluster_setup.cluster_config.mode = 'mirrored'")
  with pytest.raises(cluster.ClusterError, match="mode = 'mirrored'; choose one of "
                     "placement, spmd"):
    cluster_setup.run_in_role(None, lambda: "ran")
  gin.clear_config()
  gin.parse_config("cluster_setup.cluster_config.spmd_program = 'per_host'")
  with pytest.raises(cluster.ClusterError, match="spmd_program = 'per_host'; choose one "
                     "of auto, per_process, per_device"):
    cluster_setup.run_in_role(None, lambda: "ran")
  gin.clear_config()
  gin.parse_config("cluster_setup.cluster_config.threads_per_process = 'many'")
  with pytest.raises(cluster.ClusterError, match="'many' .cluster_config.threads_per_"
                     "process, --threads.: give 'auto', a number of cores, or 0"):
    cluster_setup.run_in_role(None, lambda: "ran")
  gin.clear_config()
  gin.parse_config("cluster_setup.cluster_config.mode = 'spmd'")
  with pytest.raises(cluster.ClusterError, match="needs the cluster: set TF_CONFIG"):
    cluster_setup.run_in_role(None, lambda: "ran")
  gin.parse_config("utils.run.mode = 'eval'")
  with pytest.raises(cluster.ClusterError, match="runs --mode=train only"):
    cluster_setup.run_in_role("a:1,b:2", lambda: "ran")
  assert cluster_setup.spmd_replicas() is None and cluster_setup.claims_model_dir()
