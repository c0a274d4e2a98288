"""XLA sharding annotations for the GSPMD backend: device meshes and `mesh_split`.

A layout maps each tensor axis to a mesh axis or to nothing; XLA's `mesh_split` sharding
says the same thing as a tile assignment over a device mesh (an array of device ids with
the mesh's shape). The device mesh carries the logical-to-physical core map: processor
`pnum` of the mtf mesh (row-major) runs on device `device_mesh.flat[pnum]`.
"""
import warnings

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.ops import gen_xla_ops
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.eager import context
from tensorflow.python.compiler.xla.experimental import xla_sharding

from mesh_tf.errors import LayoutError


def make_device_mesh(mesh_shape, device_assignment=None, logical_to_physical=None):
  """The device-id array (shape = mesh shape) for a mesh and a core assignment.

  Args:
    mesh_shape: an mtf Shape.
    device_assignment: None; a TPU DeviceAssignment, whose cores per replica must equal
      the mesh size (within a replica XLA numbers the cores 0..N-1); or a flat list of
      device ids, read as logical_to_physical.
    logical_to_physical: device id of each processor, in row-major processor order
      (default: processor i on device i).
  Raises:
    LayoutError: the assignment's size differs from the mesh's, or it repeats or skips ids.
  """
  n = mesh_shape.size
  mesh_str = mesh_shape.to_string or "[]"
  cores = getattr(device_assignment, "num_cores_per_replica", None)  # a DeviceAssignment
  if cores is not None and cores != n:
    raise LayoutError(
        "mesh %s has %d processors but the device assignment has %d cores per replica; "
        "the GSPMD mesh must cover exactly the cores of one replica" % (mesh_str, n, cores),
        mesh_dim=mesh_str)
  if device_assignment is not None and cores is None:
    if logical_to_physical is not None:
      raise LayoutError("give the core order of mesh %s once: as device_assignment or as "
                        "logical_to_physical, not both" % mesh_str, mesh_dim=mesh_str)
    logical_to_physical = device_assignment
  ids = (list(range(n)) if logical_to_physical is None
         else [int(i) for i in np.asarray(logical_to_physical).reshape(-1)])
  if len(ids) != n:
    raise LayoutError(
        "mesh %s has %d processors but the device assignment lists %d devices (%s); give "
        "one device id per processor" % (mesh_str, n, len(ids), ids), mesh_dim=mesh_str)
  if sorted(ids) != list(range(n)):
    raise LayoutError(
        "device assignment %s of mesh %s must be a permutation of 0..%d (each device "
        "once)" % (ids, mesh_str, n - 1), mesh_dim=mesh_str)
  return np.array(ids, dtype=np.int64).reshape(mesh_shape.to_integer_list)


def dims_mapping(layout):
  """XLA's tensor_split_dims_mapping of a TensorLayout: mesh axis per tensor axis, or -1."""
  return [-1 if a is None else a for a in layout]


def sharding_proto(device_mesh, layout):
  """The xla OpSharding of a tensor with this layout on this device mesh."""
  mapping = dims_mapping(layout)
  if device_mesh.size == 1 or all(a < 0 for a in mapping):
    return xla_sharding.Sharding.replicate().proto
  return xla_sharding.mesh_split_sharding(device_mesh, mapping).proto


def annotate(tensor, proto, name=None):
  """tensor passed through an XlaSharding op carrying proto (an identity unless XLA
  partitions it); `name` is its name scope, so the HLO tells which mtf tensor it is."""
  serialized = proto.SerializeToString()
  with tf.name_scope(name or "sharding"):
    out = gen_xla_ops.xla_sharding(tensor, sharding=serialized)
  if not tf.executing_eagerly():
    # TPU compilation reads the op attribute as well as the op's own argument.
    out.op._set_attr("_XlaSharding", attr_value_pb2.AttrValue(s=serialized))  # pylint: disable=protected-access
  return out


def resource_variables(variable):
  """The resource variables that hold a variable's value: itself, every component of a
  distributed variable, or every per-core copy (`_vars`) of a TPUReplicatedVariable."""
  if isinstance(variable, tf.distribute.DistributedValues):
    parts = variable.values
  else:
    parts = getattr(variable, "_vars", None)
  if parts is None:
    return [variable]
  return [leaf for part in parts for leaf in resource_variables(part)]


_warned_no_variable_sharding = []


def _xla_sharding_for_resource_variables_enabled():
  """context.xla_sharding_for_resource_variables_enabled(), or False (with one warning)
  on a TF without it."""
  enabled = getattr(context, "xla_sharding_for_resource_variables_enabled", None)
  if enabled is None:
    if not _warned_no_variable_sharding:
      _warned_no_variable_sharding.append(True)
      warnings.warn("TensorFlow %s has no sharded resource variables "
                    "(context.xla_sharding_for_resource_variables_enabled); GSPMD "
                    "annotates variable reads only" % tf.__version__, RuntimeWarning)
    return False
  return enabled()


def annotate_variable(variable, proto):
  """Stores proto on the resource variables behind `variable` where TF supports sharded
  resource variables (`context.enable_xla_sharding_for_resource_variables()`), so TF
  annotates their own reads too; returns the number of resource variables annotated."""
  if not _xla_sharding_for_resource_variables_enabled():
    return 0
  leaves = [v for v in resource_variables(variable) if hasattr(v, "_set_xla_sharding")]
  for leaf in leaves:
    leaf._set_xla_sharding(proto)  # pylint: disable=protected-access
  return len(leaves)


def scope_name(mtf_name):
  """A TF name-scope-safe form of an mtf tensor or variable name ("w1/read:0" -> ...)."""
  safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in mtf_name)
  return safe if safe[:1].isalnum() else "t" + safe
