"""Each cluster process's thread pools sized from its share of the host's cores
(mesh_tf.cluster.host_threads), and the worker's --threads."""
import socket

import pytest
import tensorflow as tf

from mesh_tf import cpu_threads
from mesh_tf.cluster import host_threads, server, spec

CLUSTER = ["localhost:1", "127.0.0.1:2", "hostA:3", "HOSTA:4", "hostb:5"]


def test_processes_on_one_host_are_counted_by_host_name():
  assert [host_threads.processes_on_host(CLUSTER, t) for t in range(5)] == [2, 2, 2, 2, 1]
  own = socket.gethostname()
  assert host_threads.processes_on_host(["localhost:1", "%s:2" % own, "[::1]:3"], 1) == 3


def test_share_divides_the_cores_among_the_processes_on_a_host(monkeypatch):
  monkeypatch.setattr(cpu_threads, "host_cores", lambda: 16)
  # two processes on this host, 4 virtual CPUs each: 8 cores each, 2 threads per op
  assert host_threads.share(CLUSTER, 0, "auto", 4) == (2, 8)
  assert host_threads.share(CLUSTER, 2, "auto", 8) == (1, 8)
  assert host_threads.share(CLUSTER, 0, "auto", 0) == (8, 8)  # GPUs: no CPU devices
  # alone on its host: one device keeps TF's sizing, several share the cores
  assert host_threads.share(CLUSTER, 4, "auto", 1) is None
  assert host_threads.share(CLUSTER, 4, "auto", 4) == (4, 16)
  assert host_threads.share(CLUSTER, 4, 6, 4) == (1, 6)  # the user's core count
  assert host_threads.share(CLUSTER, 0, 0, 4) is None
  monkeypatch.setattr(cpu_threads, "host_cores", lambda: 2)
  four = ["localhost:%d" % p for p in range(4)]
  assert host_threads.share(four, 3, "auto", 2) == (1, 1)  # never below one thread


@pytest.mark.parametrize("bad", ["many", -1, True, 1.5, None])
def test_a_bad_thread_count_is_refused_naming_the_parameter(bad):
  with pytest.raises(spec.ClusterError, match="threads per process = %s .cluster_config"
                     ".threads_per_process, --threads.: give 'auto'" % repr(bad).replace(
                         ".", r"\.")):
    host_threads.share(CLUSTER, 0, bad, 4)


def test_descriptions_say_what_was_sized():
  assert host_threads.describe(None, CLUSTER, 0) == ""
  text = host_threads.describe((1, 2), CLUSTER, 0)
  assert text == ("; 1 thread per op, 2 ops at once (2 processes share this host's %d "
                  "cores)" % cpu_threads.host_cores())
  assert host_threads.describe((3, 6), CLUSTER, 4) == "; 3 threads per op, 6 ops at once"


def test_a_worker_keeps_the_pools_its_user_chose(monkeypatch):
  monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "1")
  assert host_threads.worker_pools(CLUSTER, 0, "auto", 4) is None
  monkeypatch.delenv("TF_NUM_INTRAOP_THREADS")
  monkeypatch.delenv("TF_NUM_INTEROP_THREADS", raising=False)
  monkeypatch.setattr(cpu_threads, "host_cores", lambda: 4)
  assert host_threads.worker_pools(CLUSTER, 0, "auto", 4) == (1, 2)


def test_workers_get_their_pools_from_the_server_config():
  config = host_threads.server_config(tf.compat.v1.ConfigProto(), (1, 2))
  assert (config.intra_op_parallelism_threads, config.inter_op_parallelism_threads) == (1, 2)
  untouched = host_threads.server_config(tf.compat.v1.ConfigProto(), None)
  assert untouched.intra_op_parallelism_threads == 0
  made = server.make_server(["localhost:1", "localhost:2"], 0, 4, start=False,
                            threads=(1, 1))
  pools = made.server_def.default_session_config
  assert (pools.intra_op_parallelism_threads, pools.inter_op_parallelism_threads) == (1, 1)
  assert [host_threads.from_flag(v) for v in ("auto", "3", " 0 ", "-2")] == [
      "auto", 3, 0, -2]
  with pytest.raises(spec.ClusterError, match="'x3'"):
    host_threads.share(CLUSTER, 0, host_threads.from_flag("x3"), 4)
  with pytest.raises(spec.ClusterError, match="-2"):
    host_threads.share(CLUSTER, 0, host_threads.from_flag("-2"), 4)
