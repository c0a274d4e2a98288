"""`ProcessPlacementMeshImpl`: one process's part of a multi-process (SPMD) mesh, run as
ONE placement program over the process's own devices.

Where the processes split the mesh along whole leading axes (processor p is device p % k
of task p // k, and k is the product of the trailing mesh dims), every collective over
the trailing ("local") axes stays in the process and is placement's (one AddN where the
devices share memory), and values replicated over them are computed once. Only
collectives over the leading ("cross") axes leave the process: one TF collective op per
distinct local slice (`MultiClientMeshImpl`'s, so keys and rank order are the same as
the one-replica-per-device mode). E.g. mesh batch:2;model:4 over two processes of four
devices: the model-axis allreduces are in-memory sums, the gradients' batch-axis SUMs
are packed CollectiveReduceV2s between the two processes.

Every process must lower the same program in the same order (as in any SPMD mode): the
cross collectives of process p meet those of the others by their order.
"""
import tensorflow as tf

from mesh_tf.backends import placement_collectives as collectives
from mesh_tf.backends import simd
from mesh_tf.backends.placement import LaidOutTensor, LaidOutVariable, PlacementMeshImpl
from mesh_tf.backends.simd_multi_client import DEFAULT_TIMEOUT, MultiClientMeshImpl
from mesh_tf.errors import LayoutError
from mesh_tf.lowering.mesh_impl import MeshImpl, assemble_pieces
from mesh_tf.lowering.reductions import canonical_reduction
from mesh_tf.shapes import Shape, convert_to_shape, processor_groups


def local_mesh_axes(mesh_shape, pnums):
  """The trailing mesh axes that the consecutive processors `pnums` span whole, or None
  where they are not such a block (then each device must run its own replica)."""
  mesh_shape = convert_to_shape(mesh_shape)
  k, offset = len(pnums), pnums[0]
  if list(pnums) != list(range(offset, offset + k)) or offset % k:
    return None
  first, count = mesh_shape.ndims, 1
  while count < k and first > 0:
    first -= 1
    count *= mesh_shape.dims[first].size
  return list(range(first, mesh_shape.ndims)) if count == k else None


class ProcessLaidOutVariable(LaidOutVariable):
  """This process's slice variables of one mtf Variable (see LaidOutVariable); the first
  process keeps its drawn initial value until `sync_copies` gives it to the others."""

  def keep_initial(self, initial):
    self._initial_full = initial if self._mesh_impl.is_first_process else None

  def sync_copies(self):
    """Every process takes the first process's initial value (a masked SUM over the
    cross axes): call it in every process at once."""
    impl = self._mesh_impl
    with tf.device(impl.devices[0]):
      mine = (tf.zeros(self.shape.to_integer_list, self.slice_dtype)
              if self._initial_full is None else self._initial_full)
      full = impl.reduce_across(mine, impl.cross_axes, 0)  # setup: not recorded
    slices = impl.local_slices(full, self.shape)
    return [v.assign(slices[p]) for p, v in self._distinct()]

  def forget_initial_value(self):
    """Drops the first process's copy of the full initial value (after sync_copies)."""
    self._initial_full = None

  def read_full(self):
    """The whole variable, gathered over the processes (a collective: call it in every
    process at once), in its master dtype."""
    reads = {id(v): v.read_value() for _, v in self._distinct()}
    full = self._mesh_impl.gather_full([reads[id(v)] for v in self.slice_variables],
                                       self.shape)
    return tf.cast(full, self.master_dtype)


class ProcessPlacementMeshImpl(PlacementMeshImpl):
  """The processors `pnums` of a mesh spanning processes, placed on this process's
  `devices` (one each); see the module docstring.

  Args:
    shape, layout: the mesh and layout rules (the same in every process).
    pnums: this process's processors: consecutive, a whole block of trailing axes.
    devices: their devices, e.g. "/job:worker/replica:0/task:1/device:CPU:2".
    timeout, communication_hint: as MultiClientMeshImpl's.
  """

  LaidOutVariable = ProcessLaidOutVariable
  imports_process_share = True
  record_lone_allreduce = False  # as the one-replica-per-device mode
  packs_allreduces = True  # each cross collective is a round trip between processes

  def __init__(self, shape, layout, pnums, devices, timeout=DEFAULT_TIMEOUT,
               communication_hint="auto"):
    self._local_pnums = list(pnums)
    super().__init__(shape, layout, devices)
    self.local_axes = local_mesh_axes(self.shape, self._local_pnums)
    if self.local_axes is None:
      raise LayoutError(
          "processors %s of mesh %s are not a whole block of its trailing axes; run one "
          "replica per device instead" % (self._local_pnums, self.shape.to_string))
    self._pnums = self._local_pnums
    self.cross_axes = [a for a in range(self.ndims) if a not in self.local_axes]
    self._local_shape = Shape(self.shape.dims[self.ndims - len(self.local_axes):])
    self.timeout = float(timeout)
    # one replica per local device, used only for its collectives across processes
    self._peers = [MultiClientMeshImpl(self.shape, self.layout_rules, p, d, self._pnums,
                                       timeout, communication_hint)
                   for p, d in zip(self._pnums, self.devices)]

  def _check_devices(self, devices):
    if len(devices) != len(self._local_pnums):
      raise LayoutError("processors %s of mesh %s need one device each, but %d devices "
                        "were given (%s)" % (self._local_pnums, self.shape.to_string,
                                             len(devices), devices))

  @property
  def is_first_process(self):
    """Whether this process holds processor 0."""
    return self._pnums[0] == 0

  @property
  def pnums(self):
    """This process's processors."""
    return list(self._pnums)

  def _groups(self, mesh_axes):
    first = self.local_axes[0] if self.local_axes else self.ndims
    return processor_groups(self._local_shape, [a - first for a in mesh_axes])

  def _split(self, mesh_axes):
    return ([a for a in mesh_axes if a in self.local_axes],
            [a for a in mesh_axes if a not in self.local_axes])

  def _across(self, x, collective):
    """collective(peer replica, slice) once per distinct local slice of x (the same in
    every process: the processes' slices are alike in which of them are shared)."""
    out, done = [], {}
    for i, t in enumerate(x.tensor_list):
      key = id(t) if self.shares_memory else i
      if key not in done:
        done[key] = collective(self._peers[i], simd.LaidOutTensor([t])).one_slice
      out.append(done[key])
    return LaidOutTensor(out)

  def reduce_across(self, t, mesh_axes, index=0):
    """SUM of tf.Tensor t over the cross axes mesh_axes, by local processor `index`'s
    group (unrecorded)."""
    if not mesh_axes:
      return t
    return self._peers[index]._allreduce(  # pylint: disable=protected-access
        simd.LaidOutTensor([t]), mesh_axes, "SUM").one_slice

  def _reduced_across(self, lists, cross, reduction):
    """[[reduction over the processes of slices[i]] for slices in lists]: where the
    devices share memory, every distinct local slice (of every list) in ONE collective
    (the processes' per-processor groups, stacked); elsewhere one per processor."""
    n, m = len(self.devices), len(lists)
    if not self.shares_memory:
      results = [self._peers[i]._allreduce_packed(  # pylint: disable=protected-access
          [simd.LaidOutTensor([l[i]]) for l in lists], cross) if reduction == "SUM" else
                 [self._peers[i]._allreduce(  # pylint: disable=protected-access
                     simd.LaidOutTensor([l[i]]), cross, reduction) for l in lists]
                 for i in range(n)]
      return [[results[i][j].one_slice for i in range(n)] for j in range(m)]
    first = {}  # the first processor holding each distinct set of slices
    key = [tuple(id(l[i]) for l in lists) for i in range(n)]
    for i in range(n):
      first.setdefault(key[i], i)
    ordered = sorted(set(first.values()))
    parts = [l[i] for i in ordered for l in lists]
    with collectives.device_scope(self.devices[0]):
      flat = tf.concat([tf.reshape(t, [-1]) for t in parts], 0)
      reduced = self._peers[0]._allreduce(  # pylint: disable=protected-access
          simd.LaidOutTensor([flat]), cross, reduction).one_slice
      pieces = [tf.reshape(p, t.shape) for p, t in zip(
          tf.split(reduced, [t.shape.num_elements() for t in parts]), parts)]
    result_of = {i: pieces[k * m:(k + 1) * m] for k, i in enumerate(ordered)}
    return [[result_of[first[key[i]]][j] for i in range(n)] for j in range(m)]

  # ---- primitives: local axes are placement's, cross axes go through the peers ----
  def _allreduce(self, x, mesh_axes, reduction_fn_string):
    local, cross = self._split(mesh_axes)
    if local:
      x = super()._allreduce(x, local, reduction_fn_string)
    if not cross:
      return x
    reduction = canonical_reduction(reduction_fn_string)
    return self._later(x, lambda: LaidOutTensor(
        self._reduced_across([x.tensor_list], cross, reduction)[0]))

  def _allreduce_packed(self, xs, mesh_axes):
    local, cross = self._split(mesh_axes)
    if local:
      xs = [super(ProcessPlacementMeshImpl, self)._allreduce(x, local, "SUM") for x in xs]
    if not cross:
      return xs
    return [LaidOutTensor(o) for o in self._reduced_across(
        [x.tensor_list for x in xs], cross, "SUM")]

  def _allconcat(self, x, mesh_axis, concat_axis):
    if mesh_axis in self.local_axes:
      return super()._allconcat(x, mesh_axis, concat_axis)
    return self._across(x, lambda peer, s: peer._allconcat(s, mesh_axis, concat_axis))  # pylint: disable=protected-access

  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    if mesh_axis in self.local_axes:
      return super()._alltoall(x, mesh_axis, split_axis, concat_axis)
    return self._across(x, lambda peer, s: peer._alltoall(  # pylint: disable=protected-access
        s, mesh_axis, split_axis, concat_axis))

  def _reduce_scatter(self, x, mesh_axis, split_axis):
    if mesh_axis in self.local_axes:
      return super()._reduce_scatter(x, mesh_axis, split_axis)
    return MeshImpl._reduce_scatter(self, x, mesh_axis, split_axis)  # pylint: disable=protected-access

  def _receive(self, x, mesh_axis, source_pcoord):
    if mesh_axis in self.local_axes:
      return super()._receive(x, mesh_axis, source_pcoord)
    return self._across(x, lambda peer, s: peer._receive(s, mesh_axis, source_pcoord))  # pylint: disable=protected-access

  # ---- full tensors ----
  def process_share(self, tensor_shape):
    """(begin, size): the box of a full tensor that this process's processors hold."""
    return self._peers[0].process_share(tensor_shape)

  def import_tf_tensor(self, x, tf_x):
    """Slices of tf_x, the full tensor or this process's share of it."""
    tf_x = tf.convert_to_tensor(tf_x)
    if tf_x.shape.as_list() == x.shape.to_integer_list:
      return super().import_tf_tensor(x, tf_x)
    share_begin, share_size = self.process_share(x.shape)
    if tf_x.shape.as_list() != share_size:
      raise LayoutError("input %s of shape %s is neither the full tensor %s nor this "
                        "process's share %s" % (x.name, tf_x.shape.as_list(),
                                                x.shape.to_integer_list, share_size),
                        tensor=x.name)
    sizes = self.slice_shape(x.shape)

    def cut(i):
      begin = [b - s for b, s in zip(self.slice_begin(x.shape, self._pnums[i]), share_begin)]
      return tf.slice(tf_x, begin, sizes)
    return self._per_slice(x.shape, cut)

  def gather_full(self, slices, tensor_shape):
    """The full tensor from this process's slices: allconcats over the cross axes
    (unrecorded: a collective, so every process calls it at once), then assembled."""
    shape = convert_to_shape(tensor_shape)
    layout = list(self.tensor_layout(shape))
    x = LaidOutTensor(slices)
    sizes = self.slice_shape(shape)
    for tensor_axis, mesh_axis in enumerate(layout):
      if mesh_axis in self.cross_axes:
        x = self._allconcat(x, mesh_axis, tensor_axis)
        sizes[tensor_axis] = shape.dims[tensor_axis].size
    pieces = {}
    for i, t in enumerate(x.tensor_list):
      begin = self.slice_begin(shape, self._pnums[i])
      begin = [0 if a in self.cross_axes else b for b, a in zip(begin, layout)]
      pieces.setdefault(tuple(begin), t)
    return assemble_pieces(pieces, shape, sizes)

  def export_to_tf_tensor(self, x, laid_out_x):
    return self.gather_full(laid_out_x.tensor_list, x.shape)
