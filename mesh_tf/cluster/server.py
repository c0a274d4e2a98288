"""The TensorFlow gRPC server a worker process runs (see mesh_tf.cluster.worker)."""
import tensorflow as tf

from mesh_tf.cluster import host_threads, spec


def make_server(addresses, task, virtual_cpus=1, start=True, threads=None):
  """A tf.distribute.Server for task `task` of `addresses`, with virtual_cpus CPUs and
  threads = (intra-op, inter-op) pool sizes (None: TensorFlow's own; see
  host_threads.worker_pools)."""
  if not 0 <= task < len(addresses):
    raise spec.ClusterError("--task=%d is not an index of the %d workers %s"
                            % (task, len(addresses), ",".join(addresses)), task=task)
  if virtual_cpus < 1:
    raise spec.ClusterError("--virtual_cpus=%d: a worker needs at least 1" % virtual_cpus)
  config = host_threads.server_config(
      tf.compat.v1.ConfigProto(device_count={"CPU": int(virtual_cpus)}), threads)
  return tf.distribute.Server(spec.cluster_spec(addresses), job_name=spec.JOB,
                              task_index=task, config=config, start=start)
