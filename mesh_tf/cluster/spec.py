"""Cluster specs for meshes that span processes: parsing, TF_CONFIG, device names.

A cluster is a list of worker addresses ("host:port"), one per task of job "worker".
It comes from a flag value ("localhost:2222,localhost:2223"), a dict / tf.train.ClusterSpec,
or the TF_CONFIG environment variable ({"cluster": {"worker": [...]}, "task": {...}}).
"""
import json
import os

import tensorflow as tf

from mesh_tf.errors import MtfError

JOB = "worker"


# Said in every cluster process's start-up line: TF's runtime has no authentication.
TRUST_NOTE = ("port %s listens on every address of this host and runs any graph sent "
              "to it (no authentication; a graph can read and write files): keep it "
              "reachable only on a trusted network")


class ClusterError(MtfError):
  """A cluster does not fit the mesh, cannot be reached, or lost a task."""

  def __init__(self, message, task=None, **kwargs):
    self.task = task
    super().__init__(message, **kwargs)


def parse_addresses(cluster):
  """The worker addresses of `cluster`: "h:p,h:p", a list, {"worker": [...]} or a
  tf.train.ClusterSpec. Raises ClusterError for anything else or a bad address."""
  if isinstance(cluster, tf.train.ClusterSpec):
    cluster = cluster.as_dict()
  if isinstance(cluster, dict):
    if JOB not in cluster:
      raise ClusterError("cluster %r has no %r job; name the workers' job %r"
                         % (cluster, JOB, JOB))
    cluster = cluster[JOB]
  if isinstance(cluster, str):
    cluster = [a.strip() for a in cluster.split(",") if a.strip()]
  addresses = list(cluster or [])
  if not addresses:
    raise ClusterError("the cluster has no workers; give addresses like "
                       "'host0:2222,host1:2222'")
  for a in addresses:
    host, _, port = str(a).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ClusterError("worker address %r is not of the form host:port" % (a,))
  if len(set(addresses)) != len(addresses):
    raise ClusterError("worker addresses repeat: %s" % ",".join(addresses))
  return [str(a) for a in addresses]


def cluster_spec(addresses):
  """The tf.train.ClusterSpec of these worker addresses (job "worker")."""
  return tf.train.ClusterSpec({JOB: list(addresses)})


def from_tf_config(environ=None):
  """(worker addresses, task type, task index) from TF_CONFIG, or None when unset.

  The mesh lies over the "worker" job's devices. A "chief" task (listed under "chief"
  or not) is the single client: it issues the program and writes the checkpoints.
  """
  text = (os.environ if environ is None else environ).get("TF_CONFIG")
  if not text:
    return None
  try:
    config = json.loads(text)
  except ValueError as e:
    raise ClusterError("TF_CONFIG is not JSON: %s" % e) from None
  cluster = config.get("cluster") or {}
  task = config.get("task") or {}
  task_type = task.get("type", "chief")
  if task_type not in ("chief", JOB):
    raise ClusterError("TF_CONFIG task type %r is not 'chief' or %r" % (task_type, JOB))
  return parse_addresses(cluster.get(JOB, [])), task_type, int(task.get("index", 0))


def task_devices(num_tasks, devices_per_task, device_type="CPU"):
  """Device names of every task's devices, task-major: the order a mesh is laid out
  in, so the last mesh dims vary within a process and the first across processes."""
  return ["/job:%s/replica:0/task:%d/device:%s:%d" % (JOB, t, device_type, i)
          for t in range(num_tasks) for i in range(devices_per_task)]


def task_of_device(device):
  """The task index in a device name (0 for a device with no task: the local one)."""
  spec = tf.DeviceSpec.from_string(device if device.startswith("/") else "/" + device)
  return spec.task or 0


def processes_of_devices(devices):
  """The task of each device in a mesh's device list (for cross-process accounting)."""
  return [task_of_device(d) for d in devices]
