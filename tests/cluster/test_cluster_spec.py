"""Cluster specs and the one-line errors raised before anything runs (no processes)."""
import json
import time

import pytest

import cluster_helpers
from mesh_tf import cluster
from mesh_tf.cluster import faults


def test_addresses_from_flag_list_dict_and_tf_config():
  assert cluster.parse_addresses("a:1, b:2") == ["a:1", "b:2"]
  assert cluster.parse_addresses({"worker": ["a:1"]}) == ["a:1"]
  assert cluster.parse_addresses(cluster.cluster_spec(["a:1", "b:2"])) == ["a:1", "b:2"]
  config = {"cluster": {"chief": ["c:0"], "worker": ["a:1", "b:2"]},
            "task": {"type": "worker", "index": 1}}
  assert cluster.from_tf_config({"TF_CONFIG": json.dumps(config)}) == (
      ["a:1", "b:2"], "worker", 1)
  assert cluster.from_tf_config({}) is None


@pytest.mark.parametrize("bad, words", [
    ("", "no workers"), ("a:1,a:1", "repeat"), ("nohost", "host:port"),
    ({"ps": ["a:1"]}, "'worker' job"), ("a:99999", "host:port")])
def test_bad_cluster_is_one_line_error(bad, words):
  with pytest.raises(cluster.ClusterError, match=words) as info:
    cluster.parse_addresses(bad)
  assert "\n" not in str(info.value)


def test_device_order_is_task_major():
  devices = cluster.task_devices(2, 4)
  assert devices[3] == "/job:worker/replica:0/task:0/device:CPU:3"
  assert devices[4] == "/job:worker/replica:0/task:1/device:CPU:0"
  assert cluster.mesh_devices_for("batch:2;model:4", {0: 4, 1: 4}) == devices


@pytest.mark.parametrize("mesh, counts", [("batch:2;model:4", {0: 4, 1: 2}),
                                          ("batch:2;model:2", {0: 4, 1: 4}),
                                          ("batch:2;model:8", {0: 4, 1: 4})])
def test_device_count_mismatch_names_mesh_and_counts(mesh, counts):
  with pytest.raises(cluster.ClusterError, match="processors but the cluster's 2 tasks "
                     "offer %d/%d CPU devices" % (counts[0], counts[1])) as info:
    cluster.mesh_devices_for(mesh, counts)
  assert "\n" not in str(info.value)


def test_unreachable_worker_is_named_within_the_timeout():
  port, = cluster_helpers.free_ports(1)  # nobody listens there
  with cluster_helpers.local_listener() as live:
    addresses = [live, "localhost:%d" % port]
    start = time.time()
    with pytest.raises(cluster.ClusterError, match="worker task 1 at localhost:%d is "
                       "unreachable" % port) as info:
      cluster.check_reachable(addresses, timeout=2.0)
    assert info.value.task == 1 and "\n" not in str(info.value)
    assert faults.lost_tasks(addresses, timeout=2.0) == [1]
  assert time.time() - start < 60  # bounded: no retry loop


def test_lost_task_error_names_the_task_and_only_for_peer_errors():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  port, = cluster_helpers.free_ports(1)
  with cluster_helpers.local_listener() as live:
    addresses = [live, "localhost:%d" % port]
    unavailable = tf.errors.UnavailableError(None, None, "recvmsg:Connection reset by peer")
    err = faults.lost_task_error(unavailable, addresses)
    assert err.task == 1 and "lost worker task 1 (localhost:%d)" % port in str(err)
    assert "resume from the last checkpoint" in str(err)
    none_yet = str(faults.lost_task_error(unavailable, addresses,
                                          has_checkpoint=lambda: False))
    assert "resume" not in none_yet and "no checkpoint was written yet" in none_yet
    assert faults.lost_task_error(ValueError("x"), addresses) is None
    assert faults.lost_task_error(unavailable, [live]) is None  # all alive: not a loss


@pytest.mark.parametrize("task, cpus, words", [(2, 4, "--task=2 is not an index of the 2"),
                                               (-1, 4, "--task=-1"),
                                               (0, 0, "--virtual_cpus=0")])
def test_worker_refuses_bad_task_or_device_count(task, cpus, words):
  from mesh_tf.cluster import server  # pylint: disable=g-import-not-at-top
  with pytest.raises(cluster.ClusterError, match=words):
    server.make_server(["localhost:1", "localhost:2"], task, cpus, start=False)


def test_gpu_mismatch_hint_asks_for_equal_gpus():
  with pytest.raises(cluster.ClusterError, match="offer 2/1 GPU devices .* same number "
                     "of GPU devices"):
    cluster.mesh_devices_for("batch:4", {0: 2, 1: 1}, device_type="GPU")
  assert cluster.mesh_devices_for("batch:4", {0: 2, 1: 2}, "GPU")[3] == (
      "/job:worker/replica:0/task:1/device:GPU:1")
