"""`ProcessPlacementMeshImpl`: one process's part of a multi-process (SPMD) mesh, run as
ONE placement program over the process's own devices.

Processor p is device p % k of task p // k. Where a task's k processors are a block of
the mesh (`process_split`: every coordinate on the axes after some axis `first`, and
`inner` consecutive ones on `first`), a collective is cut in two: its part over the
process's own coordinates ("local": `inner` of axis `first`, and the later axes) is
placement's, in memory (one AddN where the devices share it), and values replicated
over them are computed once; its part over the processes ("cross": the axes before
`first`, and the blocks of axis `first`) is TF collective ops between the processes,
over the *process mesh* (the mesh axes up to `first`, that one cut to its number of
blocks), by one `MultiClientMeshImpl` per local device used only for its keys and rank
order. E.g. mesh batch:2;model:4 over two processes of four devices: model-axis
allreduces are in-memory sums, the gradients' batch-axis SUMs one CollectiveReduceV2;
mesh batch:8 over two: a batch allreduce is an AddN of 4, then one collective.

Every process must lower the same program in the same order (as in any SPMD mode): the
cross collectives of process p meet those of the others by their order.
"""
import tensorflow as tf

from mesh_tf.backends import placement_collectives as collectives
from mesh_tf.backends import simd
from mesh_tf.backends.placement import LaidOutTensor, LaidOutVariable, PlacementMeshImpl
from mesh_tf.backends.simd_multi_client import (DEFAULT_TIMEOUT, GROUP_KEY_BASE,
                                                MultiClientMeshImpl, process_box,
                                                share_begin)
from mesh_tf.errors import LayoutError
from mesh_tf.lowering import lazy_allreduce
from mesh_tf.lowering.mesh_impl import MeshImpl, assemble_pieces
from mesh_tf.lowering.reductions import canonical_reduction
from mesh_tf.shapes import Dimension, Shape, convert_to_shape, processor_groups


def process_split(mesh_shape, pnums):
  """(first, inner) where the consecutive processors `pnums` of one process are every
  processor with some coordinates on the mesh axes before `first`, `inner` consecutive
  coordinates on axis `first` and any on the axes after it; None where they are not
  such a block (then each device must run its own replica). E.g. batch:2;model:4:
  processors 0-3 give (1, 4), processors 0-1 give (1, 2); batch:8, 0-3 give (0, 4)."""
  mesh_shape = convert_to_shape(mesh_shape)
  k, offset = len(pnums), pnums[0]
  if list(pnums) != list(range(offset, offset + k)) or offset % k:
    return None
  first, rest = mesh_shape.ndims, 1  # rest: processors per coordinate of axis `first`
  while rest * (mesh_shape.dims[first - 1].size if first else 1) <= k and first > 0:
    first -= 1
    rest *= mesh_shape.dims[first].size
  if rest == k:  # whole axes from `first` on
    return first, mesh_shape.dims[first].size if first < mesh_shape.ndims else 1
  first -= 1
  size = mesh_shape.dims[first].size
  if k % rest or size % (k // rest):
    return None
  return first, k // rest


class ProcessLaidOutVariable(LaidOutVariable):
  """This process's slice variables of one mtf Variable (see LaidOutVariable); the first
  process keeps its drawn initial value until `sync_copies` gives it to the others."""

  def keep_initial(self, initial):
    self._initial_full = initial if self._mesh_impl.is_first_process else None

  def sync_copies(self):
    """Every process takes the first process's initial value (a masked SUM over the
    processes): call it in every process at once."""
    impl = self._mesh_impl
    with tf.device(impl.devices[0]):
      mine = (tf.zeros(self.shape.to_integer_list, self.slice_dtype)
              if self._initial_full is None else self._initial_full)
      full = impl.sum_over_processes(mine)  # setup: not recorded
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


class _ProcessPeer(MultiClientMeshImpl):
  """Local device `index`'s member of the process mesh's groups: its group keys differ
  from the other local devices' (each is a group of its own)."""

  def __init__(self, process_mesh, task, device, index, timeout, communication_hint):
    super().__init__(process_mesh, "", task, device, timeout=timeout,
                     communication_hint=communication_hint)
    self.index = index

  def group_key(self, mesh_axes, group):
    mask = sum(1 << a for a in set(mesh_axes))
    return GROUP_KEY_BASE + ((self.index << self.ndims) + mask) * self.size + group[0]


class ProcessPlacementMeshImpl(PlacementMeshImpl):
  """The processors `pnums` of a mesh spanning processes, placed on this process's
  `devices` (one each); see the module docstring.

  Args:
    shape, layout: the mesh and layout rules (the same in every process).
    pnums: this process's processors: consecutive, a block (see process_split).
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
    split = process_split(self.shape, self._local_pnums)
    if split is None:
      raise LayoutError(
          "processors %s of mesh %s are not a block of it (all coordinates of the last "
          "axes and consecutive ones of one axis); run one replica per device instead"
          % (self._local_pnums, self.shape.to_string))
    self._pnums = self._local_pnums
    self._first, inner = split
    dims = self.shape.dims
    # the process's own coordinates, and the processes' mesh
    self._local_shape = Shape(([Dimension(dims[self._first].name, inner)]
                               if self._first < self.ndims else []) +
                              dims[self._first + 1:])
    outer = dims[self._first].size // inner if self._first < self.ndims else 1
    process_mesh = Shape(dims[:self._first] + [Dimension(
        dims[self._first].name if self._first < self.ndims else "process", outer)])
    self.local_axes = [a for a in range(self._first, self.ndims)
                       if a > self._first or inner > 1]
    self.cross_axes = [a for a in range(min(self._first + 1, self.ndims))
                       if a < self._first or outer > 1]
    self.timeout = float(timeout)
    task = self._pnums[0] // len(self._pnums)
    self._peers = [_ProcessPeer(process_mesh, task, d, i, timeout, communication_hint)
                   for i, d in enumerate(self.devices)]

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
    return processor_groups(self._local_shape, [a - self._first for a in mesh_axes])

  def _split(self, mesh_axes):
    """(local part, cross part) of mesh_axes (an axis may have both)."""
    return ([a for a in mesh_axes if a in self.local_axes],
            [a for a in mesh_axes if a in self.cross_axes])

  def _across(self, x, collective):
    """collective(peer, slice) once per distinct local slice of x (the same in every
    process: the processes' slices are alike in which of them are shared)."""
    out, done = [], {}
    for i, t in enumerate(x.tensor_list):
      key = id(t) if self.shares_memory else i
      if key not in done:
        done[key] = collective(self._peers[i], simd.LaidOutTensor([t])).one_slice
      out.append(done[key])
    return LaidOutTensor(out)

  def sum_over_processes(self, t):
    """SUM of tf.Tensor t over every process (unrecorded)."""
    return self._peers[0]._allreduce(  # pylint: disable=protected-access
        simd.LaidOutTensor([t]), list(range(self._peers[0].ndims)), "SUM").one_slice

  def _reduced_across(self, lists, cross, reduction):
    """[[reduction over the processes of slices[i]] for slices in lists]: where the
    devices share memory, every distinct local slice (of every list) in ONE collective
    (local device i's groups, stacked); elsewhere one per device."""
    n, m = len(self.devices), len(lists)
    if not self.shares_memory:
      out = [[None] * n for _ in lists]
      for i, peer in enumerate(self._peers):
        slices = [simd.LaidOutTensor([l[i]]) for l in lists]
        reduced = (peer._allreduce_packed(slices, cross) if reduction == "SUM" else  # pylint: disable=protected-access
                   [peer._allreduce(s, cross, reduction) for s in slices])  # pylint: disable=protected-access
        for j, r in enumerate(reduced):
          out[j][i] = r.one_slice
      return out
    first = {}  # the first device holding each distinct set of slices
    key = [tuple(id(l[i]) for l in lists) for i in range(n)]
    for i in range(n):
      first.setdefault(key[i], i)
    ordered = sorted(set(first.values()))
    parts = [l[i] for i in ordered for l in lists]
    with collectives.device_scope(self.devices[0]):
      reduced = self._peers[0]._allreduce(  # pylint: disable=protected-access
          simd.LaidOutTensor([lazy_allreduce.packed(parts)]), cross, reduction).one_slice
      pieces = lazy_allreduce.unpacked(reduced, parts)
    result_of = {i: pieces[k * m:(k + 1) * m] for k, i in enumerate(ordered)}
    return [[result_of[first[key[i]]][j] for i in range(n)] for j in range(m)]

  # ---- primitives: local parts are placement's, cross parts go through the peers ----
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
    # the process's coordinates first: its block of the axis, then the blocks in order
    if mesh_axis in self.local_axes:
      x = super()._allconcat(x, mesh_axis, concat_axis)
    if mesh_axis not in self.cross_axes:
      return x
    return self._across(x, lambda peer, s: peer._allconcat(s, mesh_axis, concat_axis))  # pylint: disable=protected-access

  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    local, cross = self._split([mesh_axis])
    if not cross:
      return super()._alltoall(x, mesh_axis, split_axis, concat_axis)
    if not local:
      return self._across(x, lambda peer, s: peer._alltoall(  # pylint: disable=protected-access
          s, mesh_axis, split_axis, concat_axis))
    # an axis cut between the processes: gather it, keep this processor's piece
    return self.allsplit(self._allconcat(x, mesh_axis, concat_axis), mesh_axis, split_axis)

  def _reduce_scatter(self, x, mesh_axis, split_axis):
    if mesh_axis not in self.cross_axes:
      return super()._reduce_scatter(x, mesh_axis, split_axis)
    return MeshImpl._reduce_scatter(self, x, mesh_axis, split_axis)  # pylint: disable=protected-access

  def _receive(self, x, mesh_axis, source_pcoord):
    local, cross = self._split([mesh_axis])
    if not cross:
      return super()._receive(x, mesh_axis, source_pcoord)
    if not local:
      return self._across(x, lambda peer, s: peer._receive(s, mesh_axis, source_pcoord))  # pylint: disable=protected-access
    # an axis cut between the processes: gather it, pick the source's slice
    stacked = self._allconcat(self.slicewise(lambda t: tf.expand_dims(t, 0), x),
                              mesh_axis, 0)
    sources = tf.constant([-1 if s is None else s for s in source_pcoord], tf.int32)

    def pick(group, coord):
      source = tf.gather(sources, coord)
      taken = tf.gather(group, tf.maximum(source, 0))
      return tf.where(source >= 0, taken, tf.zeros_like(taken))
    return self.slicewise(pick, stacked, self.laid_out_pcoord(mesh_axis))

  # ---- full tensors ----
  def process_share(self, tensor_shape):
    """(begin, size): the box of a full tensor that this process's processors hold."""
    return process_box(self, tensor_shape, self._pnums)

  def import_tf_tensor(self, x, tf_x):
    """Slices of tf_x, the full tensor or this process's share of it."""
    tf_x = tf.convert_to_tensor(tf_x)
    if tf_x.shape.as_list() == x.shape.to_integer_list:
      return super().import_tf_tensor(x, tf_x)
    offset = share_begin(self, x, tf_x, self._pnums)
    sizes = self.slice_shape(x.shape)

    def cut(i):
      begin = [b - o for b, o in zip(self.slice_begin(x.shape, self._pnums[i]), offset)]
      return tf.slice(tf_x, begin, sizes)
    return self._per_slice(x.shape, cut)

  def gather_full(self, slices, tensor_shape):
    """The full tensor from this process's slices: allconcats over the axes that cross
    processes (unrecorded: a collective, so every process calls it at once), then
    assembled."""
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
