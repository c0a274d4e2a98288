"""Each cluster process's share of its host's CPU cores.

TensorFlow sizes a process's thread pools to every core of the host. When several
processes of one cluster run on one host (trying a cluster out on one machine, tests,
benchmarks), each then runs as many threads as there are cores, and together they
oversubscribe them: on 2 cores, two SPMD processes of the README LM stepped 1.4x slower
than one process with TensorFlow's sizing (benchmarks/RESULTS.md). So each process sizes
its pools (mesh_tf.cpu_threads) from its share of the cores.
"""
import socket

from mesh_tf import cpu_threads
from mesh_tf.cluster import spec

AUTO = "auto"
# Host names that always mean this machine.
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")


def _host_of(address):
  """address's host, with the names of this machine made one ("localhost")."""
  host = address.rpartition(":")[0].strip("[]").lower()
  if host in _LOOPBACK or host.startswith("127.") or host == socket.gethostname().lower():
    return "localhost"
  return host


def processes_on_host(addresses, task):
  """How many of the cluster's processes (addresses) run on task's host, task included.

  Processes are on one host when their addresses name the same host, or both name this
  machine (localhost, a loopback address or its host name)."""
  own = _host_of(addresses[task])
  return sum(_host_of(a) == own for a in addresses)


def checked(threads):
  """threads, when it is "auto" or a number of cores >= 0; else a ClusterError."""
  if threads != AUTO and (isinstance(threads, bool) or not isinstance(threads, int)
                          or threads < 0):
    raise spec.ClusterError(
        "threads per process = %r (cluster_config.threads_per_process, --threads): "
        "give 'auto', a number of cores, or 0 for TensorFlow's own sizing" % (threads,))
  return threads


def from_flag(value):
  """A --threads flag's text as share takes it: a number, else the text ("auto")."""
  text = value.strip()
  return int(text) if text.lstrip("-").isdigit() else text


def share(addresses, task, threads=AUTO, cpu_devices=1):
  """(intra-op, inter-op) pool sizes for task, which runs cpu_devices virtual CPUs (0
  for GPUs), or None for TensorFlow's own sizing.

  threads: "auto" (the host's cores divided among the cluster's processes on it), a
  number of cores this process may use, or 0 (TensorFlow's own sizing)."""
  if checked(threads) == AUTO:
    together = processes_on_host(addresses, task)
    if together == 1 and cpu_devices <= 1:
      return None
    threads = max(1, cpu_threads.host_cores() // together)
  return cpu_threads.pool_sizes(threads, cpu_devices) if threads else None


def worker_pools(addresses, task, threads=AUTO, cpu_devices=1):
  """share's sizes for a worker's server config, or None where the user sized TF's
  pools (TF_NUM_INTRAOP_THREADS, ...): a config's sizes would override those."""
  sizes = share(addresses, task, threads, cpu_devices)
  return None if cpu_threads.user_chose() else sizes


def describe(sizes, addresses, task):
  """The words for a progress line: "; 1 thread per op, 1 op at once (2 processes
  share this host's 2 cores)", or "" when TensorFlow's sizing is kept."""
  if sizes is None:
    return ""
  together = processes_on_host(addresses, task)
  return "; %s%s" % (cpu_threads.describe(sizes), "" if together == 1 else
                     " (%d processes share this host's %d cores)"
                     % (together, cpu_threads.host_cores()))


def server_config(config, sizes):
  """config (a ConfigProto) with its pools of sizes = (intra, inter) (None: unchanged)."""
  if sizes is not None:
    config.intra_op_parallelism_threads, config.inter_op_parallelism_threads = sizes
  return config
