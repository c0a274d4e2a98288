"""TPU runtime of SimdMeshImpl: the same primitives bound to TPU collectives.

The program is lowered inside `strategy.run` of a `tf.distribute.TPUStrategy` whose
device assignment puts replica r on physical core r (`device_assignment_for_mesh`), so the
physical group assignments of `SimdMeshImpl._create_group_assignment` go straight to
`CrossReplicaSum`, `AllToAll` (also as an exact all-gather) and `CollectivePermute` (see
the README). Variables are sync-on-read `tf.Variable`s of the slice shape, one component
per replica, written from the host (no TPU compilation per variable or restore).
Without a TPU, tests/backends/tpu_contract checks the runtime against stand-ins.
"""
import numpy as np
import tensorflow as tf

from mesh_tf.backends import simd_emulation
from mesh_tf.backends.simd import LaidOutTensor
from mesh_tf.backends.simd_runtime import SimdRuntime
from mesh_tf.errors import LayoutError
from mesh_tf.lowering.mesh_impl import LaidOutVariableBase
from mesh_tf.lowering import reductions
from mesh_tf.shapes import convert_to_shape

# The `T` lists of the TF 2.21 op definitions (AllToAll takes every number type and bool).
CROSS_REPLICA_SUM_DTYPES = frozenset(
    [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.uint32])
# CollectivePermute takes every number type but not bool.
COLLECTIVE_PERMUTE_CARRIERS = {tf.bool: tf.int32}


def physical_core_coordinates(topology_mesh_shape):
  """Topology coordinates [x, y, z, core] of each physical core number (row-major)."""
  sizes = [int(s) for s in topology_mesh_shape]
  return [list(c) for c in np.ndindex(*sizes)]


def device_assignment_for_mesh(topology, num_cores=None):
  """A tf.tpu.experimental.DeviceAssignment placing replica r on physical core r (the
  r-th of the topology in row-major [x, y, z, core] order, as logical_to_physical maps)."""
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
  """A sync-on-read variable with one component (this core's slice) per replica, made
  under `strategy.scope()`; read_full and assign_full work in or out of the scope."""

  def __init__(self, variable, runtime):
    self._runtime = runtime
    super().__init__(variable)
    impl = runtime.impl
    if not tf.distribute.has_strategy():
      raise LayoutError(
          "variable %s of a SIMD mesh with a TPU device assignment must be created under "
          "strategy.scope() of the TPUStrategy that runs it (lower the graph once there)"
          % self.name)
    strategy = tf.distribute.get_strategy()
    if strategy.num_replicas_in_sync != impl.size:
      raise LayoutError(
          "variable %s: the strategy has %d replicas but mesh %s has %d cores; the SIMD "
          "TPU runtime runs one replica per core" % (
              self.name, strategy.num_replicas_in_sync, impl.shape.to_string, impl.size))
    self._strategy = strategy
    layout = impl.tensor_layout(self.shape)
    mesh_shape = impl.shape.to_integer_list
    # Per mesh axis: its size where the variable is split along it, else 1.
    self._extents = [s if a in layout.mesh_axes else 1 for a, s in enumerate(mesh_shape)]
    self.variable = tf.Variable(
        tf.zeros(impl.slice_shape(self.shape), self.slice_dtype), trainable=False,
        name=self.name.replace("/", "_") + "_slice",
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.NONE)
    self.assign_full(self.initial_full_value(variable))

  @property
  def laid_out_tensor(self):
    return LaidOutTensor([self.variable.read_value()])

  def assign_to_slices(self, assign_fn, laid_out_values):
    return [assign_fn(self.variable, tf.cast(laid_out_values.one_slice, self.slice_dtype))]

  def _components(self):
    """The per-core variables, indexed by physical core (= replica id)."""
    components = self._strategy.experimental_local_results(self.variable)
    if len(components) != self._runtime.impl.size:
      raise LayoutError(
          "variable %s has %d components on this host but the mesh has %d cores; reading "
          "or writing it whole needs every core on one host" % (
              self.name, len(components), self._runtime.impl.size))
    return components

  def _compact_index(self, physical_core):
    """Index into the compact value [*extents, *slice] of a physical core's slice."""
    impl = self._runtime.impl
    coord = np.unravel_index(impl.p2l(physical_core), impl.shape.to_integer_list)
    return tuple(int(c) if e > 1 else 0 for c, e in zip(coord, self._extents))

  def read_full(self):
    """The whole variable (one copy of each distinct slice, reassembled)."""
    components = self._components()
    impl, host = self._runtime.impl, self._runtime.host
    distinct = []
    for coord in np.ndindex(*self._extents):
      logical = int(np.ravel_multi_index(coord, impl.shape.to_integer_list)) if coord else 0
      distinct.append(tf.convert_to_tensor(components[impl.l2p(logical)]))
    compact = tf.reshape(tf.stack(distinct), self._extents + impl.slice_shape(self.shape))
    return tf.cast(host.full_from_compact(compact, self.shape), self.master_dtype)

  def assign_full(self, value):
    """Sends each core its own slice of a full value (eagerly, from the host)."""
    value = tf.cast(value, self.slice_dtype)
    compact = self._runtime.host.compact_from_full(value, self.shape)
    for core, component in enumerate(self._components()):
      component.assign(compact[self._compact_index(core)])


class TpuRuntime(SimdRuntime):
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
    return tf.constant(self.host.groups(mesh_axes).assignment, tf.int32)

  def _group_size(self, mesh_axes):
    return int(self.host.groups(mesh_axes).assignment.shape[1])

  def slicewise(self, fn, *inputs):
    out = fn(*[x.one_slice if isinstance(x, LaidOutTensor) else x for x in inputs])
    if isinstance(out, (tuple, list)):
      return tuple(LaidOutTensor([o]) for o in out)
    return LaidOutTensor([out])

  def _all_gather(self, t, mesh_axes):
    """[group_size, *slice]: every member's slice, in group order, bit for bit (one
    AllToAll of the slice repeated once per member)."""
    n = self._group_size(mesh_axes)
    repeated = tf.tile(t[tf.newaxis], [n] + [1] * t.shape.rank)
    return tf.raw_ops.AllToAll(input=repeated,
                               group_assignment=self._group_assignment(mesh_axes),
                               concat_dimension=0, split_dimension=0, split_count=n)

  def allreduce(self, x, mesh_axes, reduction_fn_string):
    reduction_fn_string = reductions.check_collective_reduction(reduction_fn_string)
    if not mesh_axes:
      return x
    t = x.one_slice
    if reduction_fn_string != "SUM" or t.dtype not in CROSS_REPLICA_SUM_DTYPES:
      reduce = reductions.reduction_fn(reduction_fn_string)
      return LaidOutTensor([reduce(self._all_gather(t, mesh_axes), axis=0)])
    upcast = (t.dtype == tf.bfloat16 and
              self._group_size(mesh_axes) > self.impl.allreduce_in_bfloat16_max_group_size)
    total = tf.raw_ops.CrossReplicaSum(
        input=tf.cast(t, tf.float32) if upcast else t,
        group_assignment=self._group_assignment(mesh_axes))
    return LaidOutTensor([tf.cast(total, t.dtype)])

  def allconcat(self, x, mesh_axis, concat_axis):
    t = x.one_slice
    gathered = self._all_gather(t, [mesh_axis])
    rank = t.shape.rank
    perm = list(range(1, concat_axis + 1)) + [0] + list(range(concat_axis + 1, rank + 1))
    shape = t.shape.as_list()
    shape[concat_axis] *= gathered.shape[0]
    return LaidOutTensor([tf.reshape(tf.transpose(gathered, perm), shape)])

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    t = x.one_slice
    n = self.impl.shape[mesh_axis].size
    if t.shape[split_axis] % n:
      raise LayoutError("alltoall over mesh axis %d (size %d): split axis %d of slice %s is "
                        "not divisible" % (mesh_axis, n, split_axis, t.shape.as_list()))
    return LaidOutTensor([tf.raw_ops.AllToAll(
        input=t, group_assignment=self._group_assignment([mesh_axis]),
        concat_dimension=concat_axis, split_dimension=split_axis, split_count=n)])

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

  @staticmethod
  def _permute_rounds(pairs):
    """pairs split into rounds in which no core sends twice (a CollectivePermute rule;
    targets are distinct already: each core receives from at most one source)."""
    rounds = []
    for pair in pairs:
      for r in rounds:
        if all(source != pair[0] for source, _ in r):
          r.append(pair)
          break
      else:
        rounds.append([pair])
    return rounds

  def receive(self, x, mesh_axis, source_pcoord):
    t = x.one_slice
    rounds = self._permute_rounds(self.source_target_pairs(mesh_axis, source_pcoord))
    carrier = COLLECTIVE_PERMUTE_CARRIERS.get(t.dtype, t.dtype)
    sent = tf.cast(t, carrier)
    received = tf.zeros_like(sent)  # what a core nobody sends to gets
    for pairs in rounds:
      got = tf.raw_ops.CollectivePermute(
          input=sent, source_target_pairs=tf.constant(pairs, tf.int32, shape=[len(pairs), 2]))
      if len(rounds) == 1:
        received = got
      else:
        targets = np.zeros([self.impl.size], bool)
        targets[[target for _, target in pairs]] = True
        received = tf.where(self._table(tf.constant(targets)), got, received)
    return LaidOutTensor([tf.cast(received, t.dtype)])

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
        laid_out_x = self.impl.allconcat(laid_out_x, mesh_axis, axis)  # recorded
    return laid_out_x.one_slice

  def make_variable(self, variable):
    return TpuLaidOutVariable(variable, self)
