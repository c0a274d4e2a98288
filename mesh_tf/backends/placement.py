"""`PlacementMeshImpl`: one TF op per processor, each placed with `tf.device`.

A laid-out tensor is a list of per-device tf.Tensors (indexed by processor number);
collectives are explicit cross-device TF ops within each processor group. Runs on virtual
CPU devices, GPUs, or any devices TF's runtime can place ops on.
"""
import tensorflow as tf

from mesh_tf.backends import placement_collectives as collectives
from mesh_tf.backends import slice_replay
from mesh_tf.backends import slice_segments
from mesh_tf.errors import LayoutError
from mesh_tf.lowering import direct_ops, laid_out_tensor, lazy_allreduce
from mesh_tf.lowering.mesh_impl import LaidOutVariableBase, MeshImpl, graph_cached
from mesh_tf.lowering.reductions import canonical_reduction
from mesh_tf.shapes import pnum_to_processor_coordinates, processor_coordinates_to_pnum


class LaidOutTensor(laid_out_tensor.LaidOutTensor):
  """Per-processor slices of one mtf Tensor (tensor_list[pnum], on devices[pnum]).

  While a step is traced, slices may wait on a slice_segments.Segment or a
  `_DeferredCollective`; reading `tensor_list` makes them."""

  def __init__(self, tensor_list, pending=None, slice_shape=None):  # pylint: disable=super-init-not-called
    self._slices = list(tensor_list)
    self._pending = pending
    self._slice_shape = slice_shape
    self._read_later = None  # tests of whether code yet to be built may read the slices
    self._reps = None  # partition(), once the slices are made

  @property
  def tensor_list(self):
    if self._pending is not None:
      self._pending.complete(self)
    return self._slices

  @tensor_list.setter
  def tensor_list(self, value):
    self.fill(value)

  @property
  def first_slice(self):
    """Processor 0's slice, without completing a segment."""
    if self._slices[0] is None:
      self._pending.complete(self)
    return self._slices[0]

  one_slice = first_slice

  @property
  def slice_shape(self):
    if self._slices[0] is None:
      return list(self._slice_shape)
    return self._slices[0].shape.as_list()

  @property
  def segment(self):
    """The segment the other slices wait on, or None."""
    return self._pending if isinstance(self._pending, slice_segments.Segment) else None

  def peek_slices(self):
    """The slices as they stand (None where one waits on a segment)."""
    return self._slices

  def may_be_read_later(self, test):
    """Notes test(): whether code not built yet may still read these slices (a segment
    completing while every test says no makes them only if they are read after all)."""
    if self._read_later is None:
      self._read_later = []
    self._read_later.append(test)

  def read_later(self):
    """Whether the slices may still be read (True unless every noted test says no)."""
    return self._read_later is None or any(test() for test in self._read_later)

  def fill(self, slices):
    """Sets the slices that were waiting."""
    self._slices = list(slices)
    self._pending = None
    self._reps = None

  def partition(self, shares_memory):
    """reps[p] = the first processor whose slice is p's very tensor (only p itself where
    memory is not shared), without making slices that wait on a segment."""
    if self.segment is not None:
      return self.segment.reps
    if self._reps is None:
      if shares_memory:
        first = {}
        self._reps = tuple(first.setdefault(id(t), p) for p, t in enumerate(self.tensor_list))
      else:
        self._reps = tuple(range(len(self._slices)))
    return self._reps


class _DeferredCollective:
  """A collective on slices waiting on a segment, made when its result is first read (so
  the segment of a backward pass keeps growing until the updates read the gradients)."""

  def __init__(self, graph, make, target):
    self._graph = graph
    self._make = make
    self._target = target

  def complete(self, reader=None):  # pylint: disable=unused-argument
    make, self._make = self._make, None
    if make is not None:
      with self._graph.as_default(), self._graph.control_dependencies(None):
        self._target.fill(make().tensor_list)


class LaidOutVariable(LaidOutVariableBase):
  """Per-device slice variables of one mtf Variable; the only copy of its state.

  `slice_variables[pnum]` is processor pnum's slice. Where the devices share this
  process's memory, the processors holding the same slice share one tf.Variable."""

  def __init__(self, variable, mesh_impl):
    self._variable = variable
    self._mesh_impl = mesh_impl
    super().__init__(variable)
    initial = self.initial_full_value(variable)
    self.keep_initial(initial)
    slices = mesh_impl.local_slices(initial, self.shape)
    self.slice_variables, made = [], {}
    for pnum, s in enumerate(slices):
      key = mesh_impl.slice_key(self.shape, pnum)
      if key not in made:
        with tf.device(mesh_impl.devices[pnum]):
          made[key] = tf.Variable(
              s, name="%s_slice_%d" % (self.name.replace("/", "_"), pnum), trainable=False)
      self.slice_variables.append(made[key])

  def keep_initial(self, initial):
    """Hook given the full initial value (the multi-process backend keeps one)."""

  def _distinct(self):
    """(pnum, slice variable) for the first processor of each distinct variable."""
    seen = set()
    for pnum, v in enumerate(self.slice_variables):
      if id(v) not in seen:
        seen.add(id(v))
        yield pnum, v

  @property
  def laid_out_tensor(self):
    """Reads of every slice (once per distinct slice variable), as a LaidOutTensor."""
    # no Identity after the read, unlike read_value()
    return self._mesh_impl._per_slice(  # pylint: disable=protected-access
        self.shape, lambda pnum: direct_ops.read_variable(self.slice_variables[pnum]))

  def assign_to_slices(self, assign_fn, laid_out_values):
    """Applies assign_fn(slice_variable, value) on each device; returns the ops."""
    ops, values = [], laid_out_values.all_slices
    for pnum, v in self._distinct():
      with collectives.device_scope(self._mesh_impl.devices[pnum]):
        ops.append(assign_fn(v, tf.cast(values[pnum], self.slice_dtype)))
    return ops

  def read_full(self):
    """The whole variable as one tf.Tensor in its master dtype (for checkpoints)."""
    reads = {id(v): v.read_value() for _, v in self._distinct()}
    full = self._mesh_impl.combine_slices(
        [reads[id(v)] for v in self.slice_variables], self.shape)
    return tf.cast(full, self.master_dtype)

  def assign_full(self, value):
    """Sets every slice from a full-shape value (after a restore)."""
    value = tf.cast(value, self.slice_dtype)
    slices = self._mesh_impl.local_slices(value, self.shape)
    for pnum, v in self._distinct():
      v.assign(slices[pnum])


def _constant_key(x, value):
  """What makes two imported constants the same laid-out value."""
  return (tuple(x.shape.dimension_names), tuple(x.shape.to_integer_list), value.dtype,
          value.tobytes())


def _device_key(device):
  """A device name in one spelling ("cpu:1", "/CPU:1" and "/device:CPU:1" agree)."""
  try:
    spec = tf.DeviceSpec.from_string(device if device.startswith("/") else "/" + device)
  except ValueError:
    return device
  return spec.to_string().lower()


def _check_devices(mesh_shape, devices):
  if len(devices) != mesh_shape.size:
    raise LayoutError(
        "mesh shape %s has %d processors but %d devices were given (%s); give one device "
        "per processor" % (mesh_shape.to_string or "[]", mesh_shape.size, len(devices),
                           devices))
  named = [d for d in devices if d]  # "" entries: the default device, by choice
  distinct = {_device_key(d) for d in named}
  if len(distinct) < len(named):
    raise LayoutError(
        "mesh shape %s has %d processors but %d devices were given (%s): a device named "
        "twice would run several processors' ops; give one device per processor, or "
        "use the 'simd' backend to emulate a larger mesh"
        % (mesh_shape.to_string or "[]", mesh_shape.size, len(distinct), devices))
  specs = [tf.DeviceSpec.from_string(d.name) for d in tf.config.list_logical_devices()]
  known = {(spec.device_type.upper(), spec.device_index) for spec in specs}
  for d in named:
    spec = tf.DeviceSpec.from_string(d if d.startswith("/") else "/" + d)
    if spec.job or spec.device_type is None or spec.device_index is None:
      continue  # remote or partially specified: let TF place it
    if (spec.device_type.upper(), spec.device_index) not in known:
      raise LayoutError("device %r of mesh %s does not exist; this process has %s"
                        % (d, mesh_shape.to_string, sorted("%s:%d" % k for k in known)))


class PlacementMeshImpl(MeshImpl):
  """Mesh backend placing each processor's ops on its own TF device.

  Args:
    shape: mesh shape ("rows:2;cols:4", a list of Dimensions or pairs).
    layout: layout rules ("batch:rows;hidden:cols" or pairs).
    devices: one device string per processor, in row-major order; None puts every
      processor on the default device (handy to emulate a mesh on one CPU).
  """

  in_place_slice_writes = True

  def __init__(self, shape, layout, devices=None):
    super().__init__(shape, layout)
    if devices is None:
      devices = [""] * self.size
    self._check_devices(list(devices))
    self._devices = list(devices)
    # the global pnum of each processor this impl runs (all of them, here)
    self._pnums = list(range(self.size))
    self._shares_memory = collectives.shares_host_memory(self._devices)
    # Processors whose devices share a process's memory reuse one another's tensors: the
    # key of a processor's value starts with its domain (its own pnum off a CPU).
    domains = collectives.memory_domains(tuple(self._devices))
    self._domains = [d if d is not None else ("device", p) for p, d in enumerate(domains)]
    self._spans_processes = len(set(domains) - {None}) > 1
    self._slice_keys = {}  # {Shape: slice_key of each processor}

  LaidOutTensor = LaidOutTensor
  LaidOutVariable = LaidOutVariable

  def _check_devices(self, devices):
    _check_devices(self.shape, devices)

  def local_slices(self, full, tensor_shape):
    """The slices of a full tf.Tensor that this impl's processors hold, in their order."""
    slices = self.make_slices(full, tensor_shape)
    return [slices[p] for p in self._pnums]

  def _coords(self, index):
    """The mesh coordinates of this impl's processor `index`."""
    return pnum_to_processor_coordinates(self.shape, self._pnums[index])

  def _groups(self, mesh_axes):
    """The groups of this impl's processors (indices into its lists) over mesh_axes."""
    return self.processor_groups(mesh_axes)

  # Inside tf.function, make the other devices' copies of slice computations as calls
  # of one function per segment (slice_segments.py); False makes every device's ops.
  defer_copies = True

  @property
  def devices(self):
    return self._devices

  def note_readers(self, laid_out, has_unlowered_reader):
    """Notes on laid_out whether code yet to be lowered may read it (see
    LaidOutTensor.may_be_read_later): a segment leaves the rest out of its calls."""
    if isinstance(laid_out, LaidOutTensor):
      laid_out.may_be_read_later(has_unlowered_reader)

  @property
  def shares_memory(self):
    """Whether every device is a CPU of one process (this one, or one remote worker):
    then the replicas of a value are computed once, and collectives hand every device one
    result. Across several processes this holds within each."""
    return self._shares_memory

  def slicewise(self, fn, *inputs):
    laid_out = [x for x in inputs if isinstance(x, LaidOutTensor)]
    reps = self._deferrable_partition(laid_out)
    args = [x.first_slice if isinstance(x, LaidOutTensor) else x for x in inputs]
    graph = tf.compat.v1.get_default_graph() if reps is not None else None
    start = graph.num_operations() if graph is not None else 0
    first, recorded = self._run_on(0, fn, args, slice_replay.RecordedCall.earlier(fn, args))
    if reps is not None and recorded is not None:
      deferred = self._defer(graph, graph.get_operations()[start:], reps, laid_out, first)
      if deferred is not None:
        return deferred
    outputs, done = [first], {}
    key = lambda pnum, a: (self._domains[pnum],) + tuple(id(t) for t in a)
    done[key(0, args)] = first
    for pnum in range(1, len(self._devices)):
      args = [x.tensor_list[pnum] if isinstance(x, LaidOutTensor) else x for x in inputs]
      k = key(pnum, args)
      if k not in done:
        done[k], recorded = self._run_on(pnum, fn, args, recorded)
      outputs.append(done[k])
    if isinstance(outputs[0], (tuple, list)):
      return tuple(LaidOutTensor(list(o)) for o in zip(*outputs))
    return LaidOutTensor(outputs)

  def _run_on(self, pnum, fn, args, recorded):
    """(fn(*args) on pnum's device, copied from recorded where it matches; the recording
    to copy next)."""
    device = self._devices[pnum]
    with collectives.device_scope(device):
      result = recorded.replay(args, device) if recorded is not None else None
      if result is None:
        result, recorded = slice_replay.RecordedCall.record(fn, args)
    return result, recorded

  def _deferrable_partition(self, laid_out):
    """reps[p] = the first processor with p's inputs, where a call on these inputs may be
    deferred to a segment; else None."""
    if not self.defer_copies or len(self._devices) == 1 or not laid_out:
      return None
    graph = direct_ops.graph_for()  # a graph no tape watches
    if graph is None or graph._control_dependencies_stack:  # pylint: disable=protected-access
      return None
    for x in laid_out:  # a segment of another graph or partition completes first
      if x.segment is not None and x.segment.graph is not graph:
        x.segment.complete(x)
    parts = {x.partition(self._shares_memory) for x in laid_out}
    if len(parts) == 1:
      (reps,) = parts
    else:  # processors alike in every input
      first = {}
      reps = tuple(first.setdefault(k, p) for p, k in enumerate(zip(*parts)))
    if not any(reps):  # every processor's inputs are the same: computed once
      return None
    for x in laid_out:
      if x.segment is not None and x.segment.reps != reps:
        x.segment.complete(x)
    return reps

  def _defer(self, graph, ops, reps, laid_out, first):
    """Laid-out results of a call whose other devices' copies join the graph's open
    segment; None where they cannot."""
    results = list(first) if isinstance(first, (tuple, list)) else [first]
    if not all(isinstance(t, tf.Tensor) for t in results):
      return None
    segment = slice_segments.open_segment(graph, self, reps, self._devices)
    if not segment.accepts(ops, results) or segment.conflicts(laid_out):
      return None
    outs = segment.add(ops, laid_out, results, LaidOutTensor)
    return tuple(outs) if isinstance(first, (tuple, list)) else outs[0]

  def _per_group(self, x, mesh_axes, collective):
    """Runs collective(group's slices, group's devices) for each processor group."""
    out = [None] * len(self._devices)
    for group in self._groups(mesh_axes):  # processors in pcoord order
      results = collective([x.tensor_list[p] for p in group],
                           [self._devices[p] for p in group])
      for p, r in zip(group, results):
        out[p] = r
    return LaidOutTensor(out)

  def _allreduce(self, x, mesh_axes, reduction_fn_string):
    reduction_fn_string = canonical_reduction(reduction_fn_string)
    if not mesh_axes:
      return x
    return self._later(x, lambda: self._per_group(
        x, mesh_axes, lambda xs, ds: collectives.allreduce(xs, ds, reduction_fn_string)))

  def _later(self, x, make):
    """make() now, or, where x waits on a segment of the graph being built, a laid-out
    tensor that runs make() when first read."""
    segment = x.segment
    if segment is None or tf.executing_eagerly():
      return make()
    graph = tf.compat.v1.get_default_graph()
    if graph is not segment.graph or graph._control_dependencies_stack:  # pylint: disable=protected-access
      return make()
    out = LaidOutTensor([None] * len(self._devices), slice_shape=x.slice_shape)
    out._pending = _DeferredCollective(graph, make, out)  # pylint: disable=protected-access
    return out

  @property
  def packs_allreduces(self):
    """Whether owed SUMs are paid together: where the mesh spans processes (a cluster),
    whose copies between them are each a gRPC round trip."""
    return self._spans_processes

  def _allreduce_packed(self, xs, mesh_axes):
    """One allreduce of every processor's slices of xs, concatenated."""
    if len(xs) == 1:
      return [self._allreduce(xs[0], mesh_axes, "SUM")]
    lists = [x.tensor_list for x in xs]
    flat = self._once_per(
        lambda p: (self._domains[p],) + tuple(id(l[p]) for l in lists),
        lambda p: lazy_allreduce.packed([l[p] for l in lists]))
    summed = self._allreduce(flat, mesh_axes, "SUM").tensor_list
    pieces = self._once_per(
        lambda p: (self._domains[p], id(summed[p])),
        lambda p: lazy_allreduce.unpacked(summed[p], [l[0] for l in lists]))
    return [LaidOutTensor([parts[j] for parts in pieces.tensor_list])
            for j in range(len(xs))]

  def _allconcat(self, x, mesh_axis, concat_axis):
    return self._per_group(x, [mesh_axis], lambda xs, ds: collectives.allconcat(
        xs, ds, concat_axis))

  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    return self._per_group(x, [mesh_axis], lambda xs, ds: collectives.alltoall_pointtwise(
        xs, ds, split_axis, concat_axis))

  def _reduce_scatter(self, x, mesh_axis, split_axis):
    return self._per_group(x, [mesh_axis], lambda xs, ds: collectives.reduce_scatter(
        xs, ds, split_axis))

  def _receive(self, x, mesh_axis, source_pcoord):
    out = []
    offset = self._pnums[0]  # the processors of an impl are consecutive
    for pnum, device in enumerate(self._devices):
      coord = self._coords(pnum)
      source = source_pcoord[coord[mesh_axis]]
      with collectives.device_scope(device):
        if source is None:
          out.append(tf.zeros_like(x.tensor_list[pnum]))
        else:
          coord[mesh_axis] = source
          out.append(tf.identity(
              x.tensor_list[processor_coordinates_to_pnum(self.shape, coord) - offset]))
    return LaidOutTensor(out)

  def laid_out_pnum(self):
    return self._once_per(lambda pnum: pnum,
                          lambda pnum: tf.constant(self._pnums[pnum], tf.int32))

  def laid_out_pcoord(self, mesh_axis):
    coords = [self._coords(p)[mesh_axis] for p in range(len(self._devices))]
    return self._once_per(lambda pnum: (self._domains[pnum], coords[pnum]),
                          lambda pnum: tf.constant(coords[pnum], tf.int32))

  def slice_key(self, shape, pnum):
    """What identifies pnum's slice of `shape`: its memory domain and position (the
    replicas of one slice in one process share a key)."""
    keys = self._slice_keys.get(shape)
    if keys is None:  # asked for every processor of every variable and slice read
      keys = self._slice_keys[shape] = [(self._domains[i], tuple(self.slice_begin(shape, p)))
                                        for i, p in enumerate(self._pnums)]
    return keys[pnum]

  def _per_slice(self, shape, make):
    """_once_per, once per distinct slice of `shape`."""
    return self._once_per(lambda pnum: self.slice_key(shape, pnum), make)

  def _once_per(self, key, make):
    """LaidOutTensor of make(pnum) on each device, made once per distinct key(pnum)."""
    out, first = [], {}
    for pnum, device in enumerate(self._devices):
      k = key(pnum)
      if k not in first:
        with collectives.device_scope(device):
          first[k] = make(pnum)
      out.append(first[k])
    return LaidOutTensor(out)

  def import_tf_tensor(self, x, tf_x):
    slices = self.local_slices(tf_x, x.shape)
    return self._per_slice(x.shape, lambda pnum: direct_ops.identity(slices[pnum]))

  def import_constant(self, x, value):
    """One constant per device holding its slice of the numpy value, once per graph for
    each distinct value."""
    sizes = self.slice_shape(x.shape)

    def piece(pnum):
      begin = self.slice_begin(x.shape, self._pnums[pnum])
      return tf.constant(value[tuple(slice(b, b + n) for b, n in zip(begin, sizes))])
    return graph_cached((self, _constant_key(x, value)),
                        lambda: self._per_slice(x.shape, piece))

  def export_to_tf_tensor(self, x, laid_out_x):
    return self.combine_slices(laid_out_x.tensor_list, x.shape)

  def make_variable(self, variable):
    return self.LaidOutVariable(variable, self)
