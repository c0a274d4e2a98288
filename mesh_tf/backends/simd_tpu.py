"""TPU runtime of SimdMeshImpl: the same primitives bound to TPU collectives.

The program is lowered inside `strategy.run` of a `tf.distribute.TPUStrategy` whose
device assignment puts replica r on physical core r (`device_assignment_for_mesh`), so a
replica id is a physical core number and the group assignments of
`SimdMeshImpl._create_group_assignment` (physical ids) go straight to the collectives:

- allreduce SUM: `CrossReplicaSum` with the group assignment (bfloat16 summed in float32
  for groups above `allreduce_in_bfloat16_max_group_size`); MAX/MIN: an all-gather by
  summing one-hot-placed slices, then a local reduction;
- allconcat: the same all-gather, merged into the concat axis;
- alltoall: `AllToAll`; receive/shift: `CollectivePermute` (cores nobody sends to get 0);
- laid_out_pnum/pcoord/slice_begin: tables indexed by the replica id.

Variables are sync-on-read `tf.Variable`s of the slice shape: one component per replica,
each holding that core's slice. They must be created under `strategy.scope()`.

Limits: this module imports and its host-side parts (device assignment, core order, group
assignments) are unit-tested without a TPU; the collectives themselves have not been run
on TPU hardware in this project's CI.
"""
import numpy as np
import tensorflow as tf

from mesh_tf.backends import simd_emulation
from mesh_tf.backends.simd import LaidOutTensor
from mesh_tf.errors import LayoutError
from mesh_tf.lowering.mesh_impl import LaidOutVariableBase
from mesh_tf.shapes import convert_to_shape


def physical_core_coordinates(topology_mesh_shape):
  """Topology coordinates [x, y, z, core] of each physical core number (row-major)."""
  sizes = [int(s) for s in topology_mesh_shape]
  return [list(c) for c in np.ndindex(*sizes)]


def device_assignment_for_mesh(topology, num_cores=None):
  """A tf.tpu.experimental.DeviceAssignment placing replica r on physical core r.

  Physical core r is the r-th core of the topology in row-major [x, y, z, core] order,
  the numbering that logical_to_physical maps (e.g. auto_logical_to_physical_tpu with
  physical_shape = topology.mesh_shape) refer to.
  """
  coords = physical_core_coordinates(topology.mesh_shape)
  if num_cores is not None and num_cores != len(coords):
    raise LayoutError("the mesh has %d cores but the TPU topology %s has %d"
                      % (num_cores, list(topology.mesh_shape), len(coords)))
  core_assignment = np.array(coords, np.int32).reshape([len(coords), 1, -1])
  return tf.tpu.experimental.DeviceAssignment(topology, core_assignment)


def _replica_id():
  context = tf.distribute.get_replica_context()
  if context is None:
    raise LayoutError("the SIMD TPU runtime lowers inside strategy.run (replica context); "
                      "none is active")
  return tf.cast(context.replica_id_in_sync_group, tf.int32)


class TpuLaidOutVariable(LaidOutVariableBase):
  """A sync-on-read variable with one component (this core's slice) per replica."""

  def __init__(self, variable, runtime):
    self._runtime = runtime
    super().__init__(variable)
    sizes = runtime.impl.slice_shape(self.shape)
    self.variable = tf.Variable(
        tf.zeros(sizes, self.slice_dtype), trainable=False,
        name=self.name.replace("/", "_") + "_slice",
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.NONE)
    self.assign_full(self.initial_full_value(variable))

  @property
  def laid_out_tensor(self):
    return LaidOutTensor([self.variable.read_value()])

  def assign_to_slices(self, assign_fn, laid_out_values):
    return [assign_fn(self.variable, tf.cast(laid_out_values.one_slice, self.slice_dtype))]

  def read_full(self):
    strategy = tf.distribute.get_strategy()
    stacked = tf.stack([tf.convert_to_tensor(v) for v in
                        strategy.experimental_local_results(self.variable)])
    return tf.cast(self._runtime.host.unstack_full(stacked, self.shape), self.master_dtype)

  def assign_full(self, value):
    stacked = self._runtime.host.stack_full(tf.cast(value, self.slice_dtype), self.shape)
    strategy = tf.distribute.get_strategy()
    strategy.run(lambda s: self.variable.assign(tf.gather(s, _replica_id())),
                 args=(stacked,))


class TpuRuntime:
  """SIMD primitives for one TPU core (see the module docstring)."""

  LaidOutTensor = LaidOutTensor

  def __init__(self, impl):
    self.impl = impl
    # Host-side tables over all physical cores, shared with the emulation.
    self.host = simd_emulation.EmulationRuntime(impl)

  def _table(self, stacked_constant):
    """This core's row of a [num_cores, ...] table in physical order."""
    return tf.gather(stacked_constant, _replica_id())

  def _group_assignment(self, mesh_axes):
    return tf.constant(self.host.groups(mesh_axes).assignment)

  def slicewise(self, fn, *inputs):
    out = fn(*[x.one_slice if isinstance(x, LaidOutTensor) else x for x in inputs])
    if isinstance(out, (tuple, list)):
      return tuple(LaidOutTensor([o]) for o in out)
    return LaidOutTensor([out])

  def _all_gather(self, t, mesh_axes):
    """[group_size, *slice]: every member's slice, in group order."""
    groups = self.host.groups(mesh_axes)
    n = groups.assignment.shape[1]
    member = self._table(tf.constant(groups.position % n))
    placed = tf.reshape(tf.one_hot(member, n, dtype=t.dtype), [n] + [1] * t.shape.rank)
    return tf.raw_ops.CrossReplicaSum(input=placed * t[tf.newaxis],
                                      group_assignment=self._group_assignment(mesh_axes))

  def allreduce(self, x, mesh_axes, reduction_fn_string):
    if not mesh_axes:
      return x
    t = x.one_slice
    self.impl.record_collective("allreduce", mesh_axes, t.shape.as_list(), t.dtype)
    if reduction_fn_string in ("MAX", "MIN"):
      reduce = tf.reduce_max if reduction_fn_string == "MAX" else tf.reduce_min
      return LaidOutTensor([reduce(self._all_gather(t, mesh_axes), axis=0)])
    if reduction_fn_string != "SUM":
      raise LayoutError("unknown reduction %r; use SUM, MAX or MIN" % reduction_fn_string)
    group_size = self.host.groups(mesh_axes).assignment.shape[1]
    upcast = (t.dtype == tf.bfloat16 and
              group_size > self.impl.allreduce_in_bfloat16_max_group_size)
    total = tf.raw_ops.CrossReplicaSum(
        input=tf.cast(t, tf.float32) if upcast else t,
        group_assignment=self._group_assignment(mesh_axes))
    return LaidOutTensor([tf.cast(total, t.dtype)])

  def allconcat(self, x, mesh_axis, concat_axis):
    t = x.one_slice
    self.impl.record_collective("allconcat", [mesh_axis], t.shape.as_list(), t.dtype)
    gathered = self._all_gather(t, [mesh_axis])
    rank = t.shape.rank
    perm = list(range(1, concat_axis + 1)) + [0] + list(range(concat_axis + 1, rank + 1))
    shape = t.shape.as_list()
    shape[concat_axis] *= gathered.shape[0]
    return LaidOutTensor([tf.reshape(tf.transpose(gathered, perm), shape)])

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    t = x.one_slice
    self.impl.record_collective("alltoall", [mesh_axis], t.shape.as_list(), t.dtype)
    return LaidOutTensor([tf.raw_ops.AllToAll(
        input=t, group_assignment=self._group_assignment([mesh_axis]),
        concat_dimension=concat_axis, split_dimension=split_axis,
        split_count=self.impl.shape[mesh_axis].size)])

  def source_target_pairs(self, mesh_axis, source_pcoord):
    """[[source physical core, target physical core]] of a receive along mesh_axis."""
    impl, pairs = self.impl, []
    sizes = impl.shape.to_integer_list
    for target in range(impl.size):
      coord = list(np.unravel_index(target, sizes))
      source = source_pcoord[coord[mesh_axis]]
      if source is not None:
        coord[mesh_axis] = source
        pairs.append([impl.l2p(int(np.ravel_multi_index(coord, sizes))), impl.l2p(target)])
    return pairs

  def receive(self, x, mesh_axis, source_pcoord):
    t = x.one_slice
    self.impl.record_collective("receive", [mesh_axis], t.shape.as_list(), t.dtype)
    return LaidOutTensor([tf.raw_ops.CollectivePermute(
        input=t, source_target_pairs=self.source_target_pairs(mesh_axis, source_pcoord))])

  def allsplit(self, x, mesh_axis, split_axis, which=None):
    t = x.one_slice
    if which is None:
      which = self.laid_out_pcoord(mesh_axis)
    which = which.one_slice if isinstance(which, LaidOutTensor) else which
    size = t.shape[split_axis] // self.impl.shape[mesh_axis].size
    begin = tf.one_hot(split_axis, t.shape.rank, dtype=tf.int32) * which * size
    sizes = t.shape.as_list()
    sizes[split_axis] = size
    return LaidOutTensor([tf.slice(t, begin, sizes)])

  def laid_out_pnum(self):
    return LaidOutTensor([self._table(self.host.laid_out_pnum().one_slice)])

  def laid_out_pcoord(self, mesh_axis):
    return LaidOutTensor([self._table(self.host.laid_out_pcoord(mesh_axis).one_slice)])

  def laid_out_slice_begin(self, tensor_shape):
    return LaidOutTensor([self._table(
        self.host.laid_out_slice_begin(tensor_shape).one_slice)])

  def laid_out_slice_num(self, tensor_shape):
    return LaidOutTensor([self._table(self.host.laid_out_slice_num(tensor_shape).one_slice)])

  def import_tf_tensor(self, x, tf_x):
    begin = self.laid_out_slice_begin(x.shape).one_slice
    return LaidOutTensor([tf.slice(tf_x, begin, self.impl.slice_shape(x.shape))])

  def export_to_tf_tensor(self, x, laid_out_x):
    """The full value on every core: allconcat over each split dim."""
    shape = convert_to_shape(x.shape)
    for axis, mesh_axis in enumerate(self.impl.tensor_layout(shape)):
      if mesh_axis is not None:
        laid_out_x = self.allconcat(laid_out_x, mesh_axis, axis)
    return laid_out_x.one_slice

  def make_variable(self, variable):
    return TpuLaidOutVariable(variable, self)
