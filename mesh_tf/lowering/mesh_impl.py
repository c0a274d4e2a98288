"""`MeshImpl`: the backend contract -- the small set of mesh primitives every op lowers to.

A backend subclasses MeshImpl and implements only its abstract methods
(`MeshImpl.__abstractmethods__`); everything else derives from them. The public
collectives (allreduce, allconcat, alltoall, receive, reduce_scatter) record themselves
once in `comm_log`, then call the backend's protected ones. Ops plan their communication
on `slice_layout` (mesh_tf/plans) and run the plan with `run_step`. The vocabulary
(laid-out tensor, slice, pnum) is in docs/adding_a_backend.md.
"""
import abc
import contextlib
import types

import tensorflow as tf

from mesh_tf.lowering import local_einsum
from mesh_tf.lowering import mesh_state
from mesh_tf.lowering import reductions
from mesh_tf.plans import rules as plan_rules
from mesh_tf.plans.steps import CollectiveRecord
from mesh_tf.shapes import convert_to_shape, list_product, processor_groups
from mesh_tf.shapes.mesh_layout import MeshLayout


class LaidOutVariableBase:
  """What every backend's laid-out variable shares: the mtf Variable's name, shape,
  dtypes and initial value. Subclasses add laid_out_tensor, assign_to_slices, read_full
  and assign_full."""

  def __init__(self, variable):
    self.name = variable.name
    self.shape = variable.shape
    self.master_dtype = variable.master_dtype
    self.slice_dtype = variable.slice_dtype
    # Per entry of the first dim, the name a checkpoint stores it under; None: whole.
    self.checkpoint_split = getattr(variable, "checkpoint_split", None)

  @staticmethod
  def initial_full_value(variable):
    """The variable's full-shape initial value in its slice dtype."""
    return tf.cast(variable.initial_value(), variable.slice_dtype)

  def copy_master_to_slices(self):
    """No-op kept for the original's API (there is no master copy)."""
    return tf.no_op() if not tf.executing_eagerly() else None

  def copy_slices_to_master(self):
    """No-op kept for the original's API (there is no master copy)."""
    return tf.no_op() if not tf.executing_eagerly() else None


# Attribute of a TF graph being built: {key: value} of `graph_cached`.
_GRAPH_CACHE_ATTR = "_mesh_tf_graph_cache"


def graph_cached(key, make):
  """make(), memoized per TF graph being built (a cond branch or loop body has its own),
  made outside any control dependencies; eagerly it is just make()."""
  if tf.executing_eagerly():
    return make()
  graph = tf.compat.v1.get_default_graph()
  cache = getattr(graph, _GRAPH_CACHE_ATTR, None)
  if cache is None:
    cache = {}
    setattr(graph, _GRAPH_CACHE_ATTR, cache)
  if key not in cache:
    with tf.control_dependencies(None):
      cache[key] = make()
  return cache[key]


class MeshImpl(abc.ABC):
  """Shape and layout of a mesh, plus the primitives a backend must provide.

  `MeshImpl(shape, layout_rules)` itself, as in the original, answers layout queries
  (its primitives raise NotImplementedError); a subclass missing a primitive cannot be
  instantiated.
  """

  def __new__(cls, *args, **kwargs):
    del args, kwargs
    return super().__new__(_LayoutQueriesOnly if cls is MeshImpl else cls)

  def __init__(self, shape, layout_rules):
    # A MeshLayout given as `shape` (with layout_rules None) is kept as is.
    if isinstance(shape, MeshLayout) and layout_rules is None:
      self._layout = shape
    else:
      self._layout = MeshLayout(shape, layout_rules)
    self._shape = self._layout.shape
    self._layout_rules = self._layout.layout_rules
    # Set while a tf.function traces: the state is then shared (see mesh_state).
    self._trace_owner = mesh_state.current_trace_owner()
    self._state = None
    # One CollectiveRecord per collective emitted, appended by record_collective.
    self.comm_log = []
    self.current_op_name = None  # set by Lowering while an op lowers
    # Innermost last: callables giving the next random step inside a lowering loop body.
    self._random_step_sources = []

  def __repr__(self):
    return "%s(shape=%s, layout=%s)" % (type(self).__name__, self._shape.to_string,
                                        self._layout_rules)

  # ---- mesh facts ----
  @property
  def mesh_layout(self):
    """The MeshLayout (mesh shape + layout rules) this backend lays tensors out by."""
    return self._layout

  @property
  def slice_layout(self):
    """The MeshLayout laid-out values are sliced by (ops plan on it): mesh_layout, except
    where values are whole (GSPMD: the compiler partitions) and plans are empty."""
    return self._layout

  @property
  def shape(self):
    return self._shape

  @property
  def needs_xla(self):
    """Whether a tf.function lowering onto this mesh must use jit_compile=True."""
    return False

  # Whether each slice is a TF tensor of its own, computed as written (not replayed, not
  # compiled), so a slice function may write into a buffer only it holds (placement).
  in_place_slice_writes = False

  @property
  def ndims(self):
    return self._shape.ndims

  @property
  def size(self):
    return self._shape.size

  @property
  def layout_rules(self):
    return self._layout_rules

  @property
  def supports_control_dependencies(self):
    return True

  def state_key(self):
    """What identifies this mesh for sharing state across traces."""
    devices = getattr(self, "devices", None)
    return (type(self).__name__, self._shape.to_string, str(self._layout_rules),
            tuple(devices) if devices is not None else None)

  @property
  def state(self):
    """The MeshState (variables, random counter) of this mesh."""
    if self._state is None:
      self._state = (mesh_state.MeshState() if self._trace_owner is None else
                     mesh_state.shared_state(self._trace_owner, self.state_key()))
      # The state's variables refer back to this MeshImpl; holding the tf.function here
      # too would keep it (a weak key of mesh_state) alive forever.
      self._trace_owner = None
    return self._state

  @property
  def variable_store(self):
    """name -> laid-out variable. Every Lowering on this MeshImpl shares it, so variables
    persist across tf.function traces and across train/eval graphs."""
    return self.state.variables

  def next_random_step(self):
    """The step of one random draw (an int64 tensor), never given to another draw: the
    counter advanced by one, or inside a loop body that draws (drawing_steps_from) the
    loop's next step."""
    if self._random_step_sources:
      return self._random_step_sources[-1]()
    return self.state.next_random_step()

  def last_random_step(self):
    """The random-op counter's value, not advanced (an int64 tensor)."""
    return self.state.last_random_step()

  def advance_random_steps(self, n):
    """Advances the random-op counter by the int64 tensor n: the draws a loop numbered
    from last_random_step() without touching the counter."""
    return self.state.advance_random_steps(n)

  @contextlib.contextmanager
  def drawing_steps_from(self, source):
    """Within the block, next_random_step() returns source() (a loop body's steps)."""
    self._random_step_sources.append(source)
    try:
      yield
    finally:
      self._random_step_sources.pop()

  def random(self, shape, tf_fn, kwargs):
    """A laid-out random tensor of mtf `shape`: tf_fn(full shape, **kwargs), cut to the
    layout, so replicas agree and the values do not depend on the layout."""
    shape = convert_to_shape(shape)
    full = tf_fn(shape.to_integer_list, **dict(kwargs))
    return self.import_tf_tensor(types.SimpleNamespace(shape=shape, name="random"), full)

  def record_collective(self, kind, mesh_axes, slice_shape, dtype):
    """Appends to comm_log one collective of `kind` ("allreduce", "allconcat", "alltoall",
    "receive", "reducescatter") over mesh_axes (ints), of per-processor input slices of
    slice_shape and dtype. Recorded when the TF ops are emitted (once per trace)."""
    group_size = list_product([self._shape[a].size for a in mesh_axes])
    slice_bytes = list_product(list(slice_shape)) * tf.as_dtype(dtype).size
    self.comm_log.append(CollectiveRecord(kind, tuple(mesh_axes), group_size, slice_bytes,
                                          self.current_op_name))

  def control_tensors(self, laid_out):
    """TF tensors that, used as control dependencies, wait for a laid-out value."""
    return list(laid_out.all_slices)

  def annotate(self, x, laid_out):
    """Hook run on each lowered value of mtf Tensor x; returns the value to record (GSPMD
    attaches x's XLA sharding)."""
    del x
    return laid_out

  def note_readers(self, laid_out, has_unlowered_reader):
    """Hook run on each recorded laid-out value: has_unlowered_reader() tells whether an
    op reading it is still to be lowered (placement's deferred slices use it)."""

  # ---- layout queries: tensor_layout is the real layout; slices follow slice_layout ----
  def tensor_dimension_to_mesh_axis(self, tensor_dimension):
    return self._layout.tensor_dimension_to_mesh_axis(tensor_dimension)

  def tensor_layout(self, arg, tensor_name=None):
    """TensorLayout of an mtf Tensor or Shape; raises LayoutError naming the tensor."""
    return self._layout.tensor_layout(arg, tensor_name=tensor_name)

  def mesh_axis_to_cumprod(self, tensor_shape):
    """For each mesh axis, the row-major stride of its tensor dim (None if unused)."""
    return self.slice_layout.mesh_axis_to_cumprod(tensor_shape)

  def slice_shape(self, tensor_shape):
    """Per-processor slice shape (a list of ints)."""
    return self.slice_layout.slice_shape(tensor_shape)

  def slice_begin(self, tensor_shape, pnum):
    """Offset of processor pnum's slice within the full tensor."""
    return self.slice_layout.slice_begin(tensor_shape, pnum)

  def slice_size(self, tensor_shape):
    return self.slice_layout.slice_size(tensor_shape)

  def laid_out_size(self, tensor_shape):
    """Number of elements stored across all processors (counting replicas)."""
    return self.slice_layout.laid_out_size(tensor_shape)

  def processor_groups(self, mesh_axes):
    return processor_groups(self._shape, list(mesh_axes))

  # ---- primitives every backend implements ----
  @abc.abstractmethod
  def slicewise(self, fn, *inputs):
    """Runs fn on each processor's slices; returns a laid-out tensor (or a tuple)."""

  @abc.abstractmethod
  def _allreduce(self, x, mesh_axes, reduction_fn_string):
    """The backend's `allreduce` (not accounted: the public one records it)."""

  @abc.abstractmethod
  def _allconcat(self, x, mesh_axis, concat_axis):
    """The backend's `allconcat` (not accounted)."""

  @abc.abstractmethod
  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    """The backend's `alltoall` (not accounted)."""

  @abc.abstractmethod
  def _receive(self, x, mesh_axis, source_pcoord):
    """The backend's `receive` (not accounted)."""

  @abc.abstractmethod
  def laid_out_pnum(self):
    """A laid-out int32 scalar: each processor's number."""

  @abc.abstractmethod
  def import_tf_tensor(self, x, tf_x):
    """Cuts a full tf.Tensor into the laid-out value of mtf Tensor x."""

  def import_constant(self, x, value):
    """The laid-out value of mtf Tensor x from a numpy array of its full shape."""
    return self.import_tf_tensor(x, tf.constant(value))

  @abc.abstractmethod
  def export_to_tf_tensor(self, x, laid_out_x):
    """Reassembles the full tf.Tensor of mtf Tensor x."""

  @abc.abstractmethod
  def make_variable(self, variable):
    """Creates the laid-out state of an mtf Variable op (called once, eagerly)."""

  # ---- collectives: each recorded here, once, then run by the backend ----
  # Whether an allreduce over groups of one processor is recorded. The multi-client
  # backend emits nothing for one and records none.
  record_lone_allreduce = True

  def allreduce(self, x, mesh_axes, reduction_fn_string, record=True):
    """Reduces ("SUM", "MAX", "MIN") across the processors that differ only on mesh_axes.

    record=False leaves it out of comm_log. An unknown reduction is a LayoutError.
    """
    reduction_fn_string = reductions.check_collective_reduction(reduction_fn_string)
    if record and self._allreduce_is_recorded(mesh_axes):
      self.record_collective("allreduce", mesh_axes, x.slice_shape, x.dtype)
    return self._allreduce(x, mesh_axes, reduction_fn_string)

  def _allreduce_is_recorded(self, mesh_axes):
    return bool(mesh_axes) and (self.record_lone_allreduce or list_product(
        [self._shape[a].size for a in mesh_axes]) > 1)

  # Whether owed SUM allreduces are paid together in one collective (allreduce_sums_packed);
  # set where each collective costs a round trip (between processes).
  packs_allreduces = False

  def allreduce_sums_packed(self, xs, mesh_axes, op_names):
    """[SUM allreduce of x over mesh_axes for x in xs], each recorded as its own
    collective (accounted to op_names[i]), emitted by `_allreduce_packed`."""
    caller = self.current_op_name
    try:
      for x, name in zip(xs, op_names):
        self.current_op_name = name
        if self._allreduce_is_recorded(mesh_axes):
          self.record_collective("allreduce", mesh_axes, x.slice_shape, x.dtype)
    finally:
      self.current_op_name = caller
    return self._allreduce_packed(xs, list(mesh_axes))

  def _allreduce_packed(self, xs, mesh_axes):
    """The backend's SUM allreduce of several laid-out values of one dtype."""
    return [self._allreduce(x, mesh_axes, "SUM") for x in xs]

  def allconcat(self, x, mesh_axis, concat_axis):
    """Gathers the slices of a group along mesh_axis and concatenates on concat_axis."""
    self.record_collective("allconcat", [mesh_axis], x.slice_shape, x.dtype)
    return self._allconcat(x, mesh_axis, concat_axis)

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    """Splits on split_axis, exchanges pieces within mesh_axis groups, concats on
    concat_axis."""
    self.record_collective("alltoall", [mesh_axis], x.slice_shape, x.dtype)
    return self._alltoall(x, mesh_axis, split_axis, concat_axis)

  def receive(self, x, mesh_axis, source_pcoord):
    """Each processor takes the slice of the processor at source_pcoord[own pcoord] on
    mesh_axis (a None source gives zeros)."""
    self.record_collective("receive", [mesh_axis], x.slice_shape, x.dtype)
    return self._receive(x, mesh_axis, source_pcoord)

  def reduce_scatter(self, x, mesh_axis, split_axis):
    """SUMs partial sums x over mesh_axis; each processor keeps its piece of split_axis."""
    self.record_collective("reducescatter", [mesh_axis], x.slice_shape, x.dtype)
    return self._reduce_scatter(x, mesh_axis, split_axis)

  def _reduce_scatter(self, x, mesh_axis, split_axis):
    """The backend's reduce_scatter; this default allreduces (unrecorded), then cuts."""
    return self.allsplit(self._allreduce(x, [mesh_axis], "SUM"), mesh_axis, split_axis)

  # ---- defaults built on the primitives ----
  def laid_out_pcoord(self, mesh_axis):
    """A laid-out int32 scalar: each processor's coordinate on mesh_axis."""
    stride = list_product(self._shape.to_integer_list[mesh_axis + 1:])
    size = self._shape[mesh_axis].size
    return self.slicewise(lambda p: (p // stride) % size, self.laid_out_pnum())

  def laid_out_slice_begin(self, tensor_shape):
    """A laid-out int32 vector: where each processor's slice starts in the full tensor."""
    tensor_shape = convert_to_shape(tensor_shape)
    layout = tuple(self.slice_layout.tensor_layout(tensor_shape))  # a value: one trace
    sizes = self.slice_shape(tensor_shape)
    axes = [a for a in layout if a is not None]
    pcoords = [self.laid_out_pcoord(a) for a in axes]

    def begin(*coords):
      coord_of = dict(zip(axes, coords))
      return tf.stack([tf.constant(0, tf.int32) if a is None else coord_of[a] * s
                       for s, a in zip(sizes, layout)]) if sizes else tf.zeros([0], tf.int32)
    return self.slicewise(begin, *pcoords)

  def laid_out_slice_num(self, tensor_shape):
    """A laid-out int32 scalar: the row-major number of the processor's coordinates on the
    mesh axes that split the tensor (equal where slices are identical)."""
    axes = sorted(self.slice_layout.tensor_layout(tensor_shape).mesh_axes)
    num = None
    for a in axes:
      coord = self.laid_out_pcoord(a)
      num = coord if num is None else self.slicewise(
          lambda n, c, size=self._shape[a].size: n * size + c, num, coord)
    return num if num is not None else self.slicewise(
        lambda p: tf.zeros_like(p), self.laid_out_pnum())

  def broadcast_impl(self, old_slices, old_shape, new_shape):
    """Broadcasts laid-out slices of old_shape to new_shape (a superset of its dims)."""
    from mesh_tf.ops.slicewise import local_broadcast  # pylint: disable=g-import-not-at-top
    old_shape, new_shape = convert_to_shape(old_shape), convert_to_shape(new_shape)
    sizes = self.slice_shape(new_shape)

    def fn(t):
      t = local_broadcast(t, old_shape, new_shape, full_rank=False)
      return t if t.shape.as_list() == sizes else tf.broadcast_to(t, sizes)
    return self.slicewise(fn, old_slices)

  def slicewise_delay_allreduce(self, fn, *inputs):
    """slicewise for a fn linear in its inputs: partial sums still owing one allreduce
    (LazyAllreduceSum) stay owing it."""
    from mesh_tf.lowering.lazy_allreduce import LazyAllreduceSum  # pylint: disable=g-import-not-at-top
    lazy = [x for x in inputs if isinstance(x, LazyAllreduceSum)]
    if lazy and len(lazy) == len(inputs) and len({x.mesh_axes for x in lazy}) == 1:
      return LazyAllreduceSum(self, self.slicewise(fn, *[x.laid_out for x in lazy]),
                              lazy[0].mesh_axes, op_name=self.current_op_name)
    return self.slicewise(fn, *[x.force() if isinstance(x, LazyAllreduceSum) else x
                                for x in inputs])

  def Print(self, x, data, message, **kwargs):  # pylint: disable=invalid-name
    """x, printing `data` (laid-out values) with `message` when it is computed."""
    deps = [tf.print(message, *[t for d in data for t in self.control_tensors(d)],
                     **kwargs)] if data else []

    def fn(t):
      with tf.control_dependencies(deps):
        return tf.identity(t)
    return self.slicewise(fn, x)

  def allsplit(self, x, mesh_axis, split_axis, which=None):
    """Keeps this processor's piece of split_axis (no communication): inverse of allconcat."""
    n = self._shape[mesh_axis].size
    if which is None:
      which = self.laid_out_pcoord(mesh_axis)

    def piece(t, w):
      size = t.shape[split_axis] // n
      begin = [0] * t.shape.rank
      sizes = t.shape.as_list()
      begin[split_axis] = w * size
      sizes[split_axis] = size
      return tf.slice(t, tf.stack(begin), sizes)
    return self.slicewise(piece, x, which)

  def shift_by_n_processors(self, x, mesh_axis, offset, wrap):
    """Each processor receives the slice from `offset` positions lower on mesh_axis."""
    return self.receive(x, mesh_axis, list(
        plan_rules.shift_sources(self._shape[mesh_axis].size, offset, wrap)))

  def run_step(self, step, x, shape):
    """Runs one plan step (mesh_tf/plans/steps.py) on laid-out value x of mtf `shape`."""
    index = convert_to_shape(shape).dimension_names.index
    if step.kind == "allconcat":
      return self.allconcat(x, step.mesh_axis, index(step.dim))
    if step.kind == "allsplit":
      return self.allsplit(x, step.mesh_axis, index(step.dim))
    if step.kind == "alltoall":
      return self.alltoall(x, step.mesh_axis, index(step.split_dim), index(step.concat_dim))
    if step.kind == "allreduce":
      return self.allreduce(x, list(step.mesh_axes), step.reduction)
    if step.kind == "receive":
      return self.receive(x, step.mesh_axis, list(step.sources))
    if step.kind == "reducescatter":
      return self.reduce_scatter(x, step.mesh_axis, index(step.dim))
    raise ValueError("unknown plan step %r" % (step,))

  # Whether a local einsum may become transposes + matmul (lowering/local_einsum.py).
  einsum_as_matmul = True

  def einsum(self, equation, *slices):
    """Local einsum of slices (lowering/local_einsum.py picks the kernel)."""
    return local_einsum.einsum(equation, *slices,
                               as_matmul=self.einsum_as_matmul and not self.needs_xla)

  def make_slices(self, tf_tensor, tensor_shape):
    """Cuts a full tf.Tensor into one slice per processor (list, by pnum)."""
    tensor_shape = convert_to_shape(tensor_shape)
    sizes = self.slice_shape(tensor_shape)
    # one tf.split per split dim, not a tf.slice and its two constants per slice
    pieces = {(): tf_tensor}
    for axis, dim in enumerate(tensor_shape.dims):
      count = dim.size // sizes[axis]
      pieces = {begin + (i * sizes[axis],): part for begin, t in pieces.items()
                for i, part in enumerate(tf.split(t, count, axis) if count > 1 else [t])}
    return [pieces[tuple(self.slice_begin(tensor_shape, pnum))] for pnum in range(self.size)]

  def combine_slices(self, slices, tensor_shape, device=None):
    """Inverse of make_slices: concatenates one copy of each distinct slice."""
    shape = convert_to_shape(tensor_shape)
    sizes = self.slice_shape(shape)
    pieces = {}
    for pnum, s in enumerate(slices):
      pieces.setdefault(tuple(self.slice_begin(shape, pnum)), s)
    return assemble_pieces(pieces, shape, sizes, device)


def assemble_pieces(pieces, shape, sizes, device=None):
  """The full tensor of mtf `shape` from {begin: piece} holding one piece of `sizes` at
  every begin of the tiling."""

  def assemble(axis, begin):
    if axis == shape.ndims:
      return pieces[tuple(begin)]
    full = shape[axis].size
    if sizes[axis] == full:
      return assemble(axis + 1, begin + [0])
    return tf.concat([assemble(axis + 1, begin + [b])
                      for b in range(0, full, sizes[axis])], axis)
  with tf.device(device or ""):
    return assemble(0, [])


def _not_a_backend(name):
  def primitive(self, *args, **kwargs):
    del self, args, kwargs
    raise NotImplementedError(
        "MeshImpl.%s: MeshImpl(shape, layout_rules) answers layout queries only; run "
        "programs on a backend, e.g. mtf.placement_mesh_impl.PlacementMeshImpl" % name)
  primitive.__name__ = name
  return primitive


# What MeshImpl(shape, layout_rules) makes: the layout queries of a mesh, no backend.
_LayoutQueriesOnly = type("_LayoutQueriesOnly", (MeshImpl,), {
    name: _not_a_backend(name) for name in MeshImpl.__abstractmethods__})
