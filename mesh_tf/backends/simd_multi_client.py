"""`MultiClientMeshImpl`: one replica of a SIMD program, in a multi-process (multi-client)
mesh, communicating through TensorFlow's collective ops.

Every process runs the same mtf program once per local device: one replica per mesh
processor, each seeing only its own slice. Collectives along mesh axes are
`CollectiveReduceV2` / `CollectiveGatherV2` / `CollectiveAllToAllV2` over the processor
groups of those axes, run by TF's collective executor over gRPC (or NCCL between GPUs).

A group is keyed by its mesh axes and lowest processor number, so every process derives
the same `group_key` without talking; `instance_key`s count the collectives a replica
emits. Each gather also exchanges the members' positions, so results come out in mesh
order whatever ranks TF gave. The replicas of one process run concurrently, each in its
own thread and tf.function (see mesh_tf.cluster.multi_client): collectives between
devices of one multi-device function never meet.
"""
import weakref

import tensorflow as tf

from mesh_tf.backends.simd import LaidOutTensor
from mesh_tf.errors import LayoutError
from mesh_tf.lowering.mesh_impl import LaidOutVariableBase, MeshImpl
from mesh_tf.lowering import lazy_allreduce, reductions
from mesh_tf.shapes import convert_to_shape, pnum_to_processor_coordinates

# Group keys start here, clear of those tf.distribute's own collectives count from 1.
GROUP_KEY_BASE = 1 << 20
DEFAULT_TIMEOUT = 60.0  # seconds a collective waits for its peers before failing


def process_box(mesh_impl, tensor_shape, pnums):
  """(begin, size): the box of a full tensor that processors `pnums` hold."""
  tensor_shape = convert_to_shape(tensor_shape)
  sizes = mesh_impl.slice_shape(tensor_shape)
  begins = [mesh_impl.slice_begin(tensor_shape, p) for p in pnums]
  lo = [min(b[i] for b in begins) for i in range(len(sizes))]
  hi = [max(b[i] for b in begins) + s for i, s in enumerate(sizes)]
  return lo, [h - l for h, l in zip(hi, lo)]


def share_begin(mesh_impl, x, tf_x, pnums):
  """Where tf_x, the full value of mtf Tensor x or the share of processors `pnums`,
  begins in the full tensor; a LayoutError naming x where it is neither."""
  full = x.shape.to_integer_list
  if tf_x.shape.as_list() == full:
    return [0] * len(full)
  begin, size = process_box(mesh_impl, x.shape, pnums)
  if tf_x.shape.as_list() != size:
    raise LayoutError("input %s of shape %s is neither the full tensor %s nor this "
                      "process's share %s" % (x.name, tf_x.shape.as_list(), full, size),
                      tensor=x.name)
  return begin


class ReplicaLaidOutVariable(LaidOutVariableBase):
  """This replica's slice of one mtf Variable: one tf.Variable on its device."""

  def __init__(self, variable, mesh_impl):
    self._mesh_impl = mesh_impl
    super().__init__(variable)
    initial = self.initial_full_value(variable)
    # processor 0 keeps its full initial value until sync_copies sends it to the others
    self._initial_full = initial if mesh_impl.pnum == 0 else None
    with tf.device(mesh_impl.device):
      self.variable = tf.Variable(self._slice_to_keep(initial),
                                  name="%s_replica_%d" % (self.name.replace("/", "_"),
                                                          mesh_impl.pnum),
                                  trainable=False)

  @property
  def laid_out_tensor(self):
    with tf.device(self._mesh_impl.device):
      return LaidOutTensor([self.variable.read_value()])

  def assign_to_slices(self, assign_fn, laid_out_values):
    with tf.device(self._mesh_impl.device):
      return [assign_fn(self.variable, tf.cast(laid_out_values.one_slice,
                                               self.slice_dtype))]

  def read_full(self):
    """The whole variable (gathered from every processor: a collective, so call it in
    every replica's function at once) in its master dtype."""
    full = self._mesh_impl.gather_full(self.variable.read_value(), self.shape)
    return tf.cast(full, self.master_dtype)

  def sync_copies(self):
    """Gives every replica processor 0's initial value (each drew its own), by a masked
    SUM allreduce over the mesh: call it in every replica's function at once."""
    impl = self._mesh_impl
    with tf.device(impl.device):
      mine = (tf.zeros(self.shape.to_integer_list, self.slice_dtype)
              if self._initial_full is None else self._initial_full)
      full = impl.allreduce(LaidOutTensor([mine]), list(range(impl.ndims)), "SUM",
                            record=False).one_slice  # setup, not a step's traffic
      return self.variable.assign(self._slice_to_keep(full))

  def forget_initial_value(self):
    """Drops processor 0's copy of the full initial value (after sync_copies)."""
    self._initial_full = None

  def assign_full(self, value):
    """Sets this replica's slice from a full-shape value (no communication)."""
    value = tf.cast(value, self.slice_dtype)
    with tf.device(self._mesh_impl.device):
      self.variable.assign(self._slice_to_keep(value))

  def _slice_to_keep(self, full):
    """This replica's slice of a full value, in a buffer of its own (TF's CPU Slice may
    return a view, which would keep the whole full-size buffer alive)."""
    with tf.device(self._mesh_impl.device):
      return tf.raw_ops.DeepCopy(x=self._mesh_impl.own_slice(full, self.shape))


class MultiClientMeshImpl(MeshImpl):
  """The replica of processor `pnum` of a mesh whose processors span processes.

  Args:
    shape: mesh shape.
    layout: layout rules.
    pnum: the processor this replica plays.
    device: its TF device, e.g. "/job:worker/replica:0/task:1/device:CPU:2".
    process_pnums: the processors of this process (for reading only this process's
      share of an input; default: just pnum).
    timeout: seconds within which the ReplicaSet's peer monitor must notice a lost peer
      process (the collectives themselves wait without a timeout).
    communication_hint: "auto", "ring" or "nccl" (GPUs), passed to the collective ops.
  """

  LaidOutTensor = LaidOutTensor
  # import_tf_tensor takes the full value or this process's share of it
  imports_process_share = True
  # an allreduce over a group of one emits no collective, so it is not recorded
  record_lone_allreduce = False
  # each collective is a round trip between processes: pack the SUMs owed at once
  packs_allreduces = True

  def __init__(self, shape, layout, pnum, device, process_pnums=None,
               timeout=DEFAULT_TIMEOUT, communication_hint="auto"):
    super().__init__(shape, layout)
    if not 0 <= pnum < self.size:
      raise LayoutError("replica pnum %d is not a processor of mesh %s (size %d)"
                        % (pnum, self.shape.to_string or "[]", self.size))
    self.pnum = pnum
    self.device = device
    self.process_pnums = list(process_pnums or [pnum])
    self.timeout = float(timeout)
    self.communication_hint = communication_hint
    self._coord = pnum_to_processor_coordinates(self.shape, pnum)
    self._instance = 0
    self._positions = weakref.WeakKeyDictionary()  # graph -> {mesh axes: positions}

  @property
  def devices(self):
    return [self.device]

  @property
  def pnums(self):
    """The processors this impl runs: its one."""
    return [self.pnum]

  def pcoord(self, mesh_axis):
    """This replica's coordinate on mesh_axis (a Python int)."""
    return self._coord[mesh_axis]

  # ---- groups and keys ----
  def group_of(self, mesh_axes):
    """The pnums (ascending, i.e. in mesh order) of this replica's group over mesh_axes."""
    return next(g for g in self.processor_groups(list(mesh_axes)) if self.pnum in g)

  def group_key(self, mesh_axes, group):
    """A key every process derives alike: the axes (as a bit mask) and the lowest pnum."""
    mask = sum(1 << a for a in set(mesh_axes))
    return GROUP_KEY_BASE + mask * self.size + group[0]

  def _next_instance(self):
    self._instance += 1
    return self._instance

  def _collective_args(self, mesh_axes, group):
    return dict(group_size=len(group), group_key=self.group_key(mesh_axes, group),
                instance_key=self._next_instance(), ordering_token=[],
                communication_hint=self.communication_hint,
                # no per-op timeout (TF keeps a thread per timed collective);
                # mesh_tf.cluster.peer_monitor notices lost peers instead
                timeout_seconds=0.0)

  def _rank_positions(self, mesh_axes, group):
    """int32 [group size]: the mesh position of the member at each TF rank."""
    cache = self._positions.setdefault(tf.compat.v1.get_default_graph(), {})
    key = tuple(sorted(set(mesh_axes)))
    if key not in cache:
      with tf.device(self.device):
        cache[key] = tf.raw_ops.CollectiveGatherV2(
            input=tf.constant([group.index(self.pnum)], tf.int32),
            **self._collective_args(mesh_axes, group))
        cache[key].set_shape([len(group)])
    return cache[key]

  def _gather(self, t, mesh_axes, group):
    """[group size, *t.shape]: the members' t, in mesh order."""
    with tf.device(self.device):
      gathered = tf.raw_ops.CollectiveGatherV2(
          input=tf.expand_dims(t, 0), **self._collective_args(mesh_axes, group))
      # row r came from the member at mesh position positions[r]
      order = tf.math.invert_permutation(self._rank_positions(mesh_axes, group))
      return tf.reshape(tf.gather(gathered, order), [len(group)] + t.shape.as_list())

  # ---- primitives ----
  def slicewise(self, fn, *inputs):
    args = [x.one_slice if isinstance(x, LaidOutTensor) else x for x in inputs]
    with tf.device(self.device):
      out = fn(*args)
    if isinstance(out, (tuple, list)):
      return tuple(LaidOutTensor([o]) for o in out)
    return LaidOutTensor([out])

  def _allreduce(self, x, mesh_axes, reduction_fn_string):
    reduction_fn_string = reductions.check_collective_reduction(reduction_fn_string)
    group = self.group_of(mesh_axes) if mesh_axes else [self.pnum]
    if len(group) == 1:
      return x
    with tf.device(self.device):
      return LaidOutTensor([tf.raw_ops.CollectiveReduceV2(
          input=x.one_slice, merge_op=reductions.collective_merge_op(reduction_fn_string),
          final_op="Id",
          **self._collective_args(mesh_axes, group))])

  def _allreduce_packed(self, xs, mesh_axes):
    group = self.group_of(mesh_axes) if mesh_axes else [self.pnum]
    if len(group) == 1 or len(xs) == 1:
      return [self._allreduce(x, mesh_axes, "SUM") for x in xs]
    slices = [x.one_slice for x in xs]
    with tf.device(self.device):
      summed = tf.raw_ops.CollectiveReduceV2(
          input=lazy_allreduce.packed(slices),
          merge_op=reductions.collective_merge_op("SUM"), final_op="Id",
          **self._collective_args(mesh_axes, group))
      return [LaidOutTensor([p]) for p in lazy_allreduce.unpacked(summed, slices)]

  def _allconcat(self, x, mesh_axis, concat_axis):
    pieces = self._gather(x.one_slice, [mesh_axis], self.group_of([mesh_axis]))
    with tf.device(self.device):
      return LaidOutTensor([tf.concat(tf.unstack(pieces), concat_axis)])

  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    t = x.one_slice
    group = self.group_of([mesh_axis])
    n = len(group)
    shape = t.shape.as_list()
    if shape[split_axis] % n:
      raise LayoutError("alltoall over mesh axis %d (size %d): split axis %d of slice %s "
                        "is not divisible" % (mesh_axis, n, split_axis, shape))
    with tf.device(self.device):
      pieces = tf.stack(tf.split(t, n, axis=split_axis))  # piece j is for position j
      positions = self._rank_positions([mesh_axis], group)
      # TF sends row r to rank r: put the piece for rank r's position there
      sent = tf.raw_ops.CollectiveAllToAllV2(
          input=tf.gather(pieces, positions), **self._collective_args([mesh_axis], group))
      received = tf.reshape(tf.gather(sent, tf.math.invert_permutation(positions)),
                            pieces.shape)
      return LaidOutTensor([tf.concat(tf.unstack(received), concat_axis)])

  def _receive(self, x, mesh_axis, source_pcoord):
    t = x.one_slice
    source = source_pcoord[self._coord[mesh_axis]]
    # every member gathers the group's slices and keeps its source's
    everyone = self._gather(t, [mesh_axis], self.group_of([mesh_axis]))
    with tf.device(self.device):
      return LaidOutTensor([tf.zeros_like(t) if source is None else everyone[source]])

  def laid_out_pnum(self):
    with tf.device(self.device):
      return LaidOutTensor([tf.constant(self.pnum, tf.int32)])

  def laid_out_pcoord(self, mesh_axis):
    with tf.device(self.device):
      return LaidOutTensor([tf.constant(self._coord[mesh_axis], tf.int32)])

  # ---- full tensors ----
  def own_slice(self, full, tensor_shape):
    """This replica's slice of a full tf.Tensor."""
    return self._cut(full, tensor_shape, self.slice_begin(tensor_shape, self.pnum))

  def _cut(self, t, tensor_shape, begin):
    sizes = self.slice_shape(tensor_shape)
    with tf.device(self.device):
      return tf.slice(t, begin, sizes) if sizes else tf.identity(t)

  def process_share(self, tensor_shape):
    """(begin, size): the box of a full tensor that this process's replicas read."""
    return process_box(self, tensor_shape, self.process_pnums)

  def import_tf_tensor(self, x, tf_x):
    """This replica's slice of tf_x, the full tensor or this process's share of it."""
    tf_x = tf.convert_to_tensor(tf_x)
    offset = share_begin(self, x, tf_x, self.process_pnums)
    begin = [b - o for b, o in zip(self.slice_begin(x.shape, self.pnum), offset)]
    return LaidOutTensor([self._cut(tf_x, x.shape, begin)])

  def gather_full(self, t, tensor_shape):
    """The full tensor from every replica's slice t (allconcats not counted in comm_log)."""
    tensor_shape = convert_to_shape(tensor_shape)
    layout = self.tensor_layout(tensor_shape)
    x = LaidOutTensor([t])
    for tensor_axis, mesh_axis in enumerate(layout):
      if mesh_axis is not None:
        x = self._allconcat(x, mesh_axis, tensor_axis)  # unrecorded
    return x.one_slice

  def export_to_tf_tensor(self, x, laid_out_x):
    return self.gather_full(laid_out_x.one_slice, x.shape)

  def make_variable(self, variable):
    return ReplicaLaidOutVariable(variable, self)
