"""The client side of a multi-process mesh: connect to the workers, get the mesh's
devices, and fail with one line when the cluster cannot hold the mesh.

    from mesh_tf import cluster
    devices = cluster.connect("host0:2222,host1:2222", "batch:2;model:4")
    mesh_impl = mtf.PlacementMeshImpl("batch:2;model:4", layout, devices)

The client process only issues ops; the workers (mesh_tf.cluster.worker) run them.
"""
import socket

import tensorflow as tf

from mesh_tf.cluster import spec
from mesh_tf.shapes import convert_to_shape

DEFAULT_CONNECT_TIMEOUT = 10.0


def check_reachable(addresses, timeout=DEFAULT_CONNECT_TIMEOUT):
  """Opens (and closes) a TCP connection to every worker within `timeout` seconds each;
  raises ClusterError naming the first task that does not answer."""
  for task, address in enumerate(addresses):
    host, _, port = address.rpartition(":")
    try:
      with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
        pass
    except OSError as e:
      raise spec.ClusterError(
          "worker task %d at %s is unreachable (%s); start it with `python -m "
          "mesh_tf.cluster.worker --cluster=%s --task=%d`"
          % (task, address, e.strerror or e, ",".join(addresses), task),
          task=task) from None


def remote_device_counts(num_tasks, device_type="CPU"):
  """{task: number of device_type devices} that the connected client sees."""
  counts = {t: 0 for t in range(num_tasks)}
  for d in tf.config.list_logical_devices(device_type):
    s = tf.DeviceSpec.from_string(d.name)
    if s.job == spec.JOB and s.task in counts:
      counts[s.task] += 1
  return counts


def mesh_devices_for(mesh_shape, counts, device_type="CPU"):
  """Task-major device names for mesh_shape from the per-task device counts; every task
  must hold the same number and all of them together exactly one per processor."""
  mesh_shape = convert_to_shape(mesh_shape)
  per_task = set(counts.values())
  total = sum(counts.values())
  if len(per_task) != 1 or total != mesh_shape.size:
    share = (mesh_shape.size // len(counts) if mesh_shape.size % len(counts) == 0
             else None)
    if device_type.upper() == "CPU" and share:
      hint = "start the workers with --virtual_cpus=%d, or change the mesh" % share
    else:
      hint = "give every worker the same number of %s devices (mesh size / workers)" % (
          device_type)
    raise spec.ClusterError(
        "mesh %s has %d processors but the cluster's %d tasks offer %s %s devices (%d "
        "in all); %s" % (mesh_shape.to_string or "[]", mesh_shape.size, len(counts),
                         "/".join(str(counts[t]) for t in sorted(counts)), device_type,
                         total, hint))
  return spec.task_devices(len(counts), per_task.pop(), device_type)


def connect(cluster, mesh_shape, device_type="CPU", timeout=DEFAULT_CONNECT_TIMEOUT):
  """Connects this process to `cluster` and returns one device name per processor of
  mesh_shape, task-major (mesh dims vary fastest within a task).

  Args:
    cluster: worker addresses ("h:p,h:p", a list, a dict or a tf.train.ClusterSpec).
    mesh_shape: the mesh to lay over the tasks' devices.
    device_type: "CPU" or "GPU".
    timeout: seconds to wait for each worker to answer before giving up.

  Raises ClusterError (one line) when a worker is unreachable or the devices do not
  match the mesh.
  """
  addresses = spec.parse_addresses(cluster)
  check_reachable(addresses, timeout)
  tf.config.experimental_connect_to_cluster(spec.cluster_spec(addresses))
  return mesh_devices_for(mesh_shape, remote_device_counts(len(addresses), device_type),
                          device_type)
