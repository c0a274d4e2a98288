"""Meshes that span processes and hosts, on TensorFlow's distributed runtime.

Workers are `python -m mesh_tf.cluster.worker` processes (tf.distribute.Server); a
client connects with `connect` and lays a PlacementMeshImpl over all their devices.
"""
from mesh_tf.cluster.client import check_reachable
from mesh_tf.cluster.client import connect
from mesh_tf.cluster.client import mesh_devices_for
from mesh_tf.cluster.faults import lost_task_error
from mesh_tf.cluster.faults import lost_tasks
from mesh_tf.cluster.faults import raise_lost_task
from mesh_tf.cluster.spec import ClusterError
from mesh_tf.cluster.spec import cluster_spec
from mesh_tf.cluster.spec import from_tf_config
from mesh_tf.cluster.spec import parse_addresses
from mesh_tf.cluster.spec import processes_of_devices
from mesh_tf.cluster.spec import task_devices
