"""The size of TensorFlow's CPU thread pools when several mesh devices share the cores.

TensorFlow sizes each process's intra-op pool (threads within one op) and inter-op
pool (ops run side by side) to every core of the host. A mesh of virtual CPUs already
runs its devices' ops side by side, so splitting each op over all cores as well only
adds threads that wait and spin: on 2 cores the README LM on 8 virtual CPUs trains
1.5-1.7x faster with one thread per op (benchmarks/RESULTS.md). So where n virtual
CPUs share c cores, each op gets max(1, c // n) threads and the inter-op pool c.
A process that shares its host with other processes of a cluster gets c = its share of
the cores (mesh_tf.cluster.host_threads).

A size the user chose (TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS, or
tf.config.threading before this runs) is always kept.
"""
import os

import tensorflow as tf

_ENV = {"intra": "TF_NUM_INTRAOP_THREADS", "inter": "TF_NUM_INTEROP_THREADS"}


def host_cores():
  """The CPU cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def pool_sizes(cores, cpu_devices):
  """(intra-op, inter-op) threads for cpu_devices virtual CPUs (0 for another device
  type) sharing `cores` cores."""
  cores = max(1, int(cores))
  return max(1, cores // max(1, cpu_devices)), cores


def user_chose():
  """Whether the user already sized the pools (environment or tf.config.threading)."""
  threading = tf.config.threading
  return bool(any(os.environ.get(v) for v in _ENV.values())
              or threading.get_intra_op_parallelism_threads()
              or threading.get_inter_op_parallelism_threads())


def apply(sizes):
  """Sizes this process's pools to sizes = (intra, inter) (None: leaves them), unless
  the user chose sizes or TensorFlow already started. Returns the sizes set, or None."""
  if sizes is None or user_chose():
    return None
  try:
    tf.config.threading.set_intra_op_parallelism_threads(sizes[0])
    tf.config.threading.set_inter_op_parallelism_threads(sizes[1])
  except RuntimeError:  # TensorFlow already started: its pools stay as they are
    return None
  return tuple(sizes)


def intra_op_threads():
  """Threads one CPU op may use in this process (the configured or environment size,
  else every core)."""
  configured = tf.config.threading.get_intra_op_parallelism_threads()
  if not configured and os.environ.get(_ENV["intra"], "").strip().isdigit():
    configured = int(os.environ[_ENV["intra"]])
  return configured or host_cores()


def describe(sizes):
  """The sizes in words: "1 thread per op, 2 ops at once", or "" for None."""
  if sizes is None:
    return ""
  return "%d thread%s per op, %d op%s at once" % (
      sizes[0], "" if sizes[0] == 1 else "s", sizes[1], "" if sizes[1] == 1 else "s")
