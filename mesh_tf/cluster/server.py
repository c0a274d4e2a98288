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


def serve(addresses, task, virtual_cpus, threads=host_threads.AUTO):
  """Runs task `task` of `addresses` as a worker with virtual_cpus CPU devices, its pools
  sized by host_threads.worker_pools(threads); prints its start-up line, then serves
  until the process is killed."""
  sizes = host_threads.worker_pools(addresses, task, threads, virtual_cpus)
  server = make_server(addresses, task, virtual_cpus, threads=sizes)
  print("worker %d of %d serving %s with %d CPU devices%s; %s"
        % (task, len(addresses), addresses[task], virtual_cpus,
           host_threads.describe(sizes, addresses, task),
           spec.TRUST_NOTE % addresses[task].rpartition(":")[2]), flush=True)
  server.join()
