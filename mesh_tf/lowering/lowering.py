"""`Lowering`: compiles an mtf Graph into TF ops, one MeshImpl per mesh.

Build the mtf graph once, then create a Lowering wherever TF ops should be emitted
(eagerly or inside a `tf.function` trace). Ops are lowered on demand:
`export_to_tf_tensor(x)` and `lowered_operation(op)` emit only what they need, in graph
order. Variables live on the MeshImpl (`mesh_impl.variable_store`), created once, eagerly,
so every later Lowering reuses them.
"""
import collections
import functools

import tensorflow as tf

from mesh_tf.errors import LayoutError, ShapeError
from mesh_tf.lowering import lazy_allreduce, speed_layer


# AutoGraph must not rewrite the lowering inside a tf.function (seconds per trace).
_no_autograph = tf.autograph.experimental.do_not_convert


class Lowering:
  """Lowers a Graph to TF given {Mesh: MeshImpl}.

  Args:
    graph: the mtf Graph.
    mesh_to_impl: dict from each Mesh used by the graph to its MeshImpl.
    autostack, log_file: accepted for compatibility; ignored.
    feeds: optional {mtf Tensor from import_tf_tensor: TF value} replacing the imported
      value for this lowering (e.g. a tf.function's arguments).
  """

  @_no_autograph
  def __init__(self, graph, mesh_to_impl, autostack=True, log_file=None, feeds=None):
    del autostack, log_file
    self.graph = graph
    self.mesh_to_impl = dict(mesh_to_impl)
    self.feeds = dict(feeds or {})
    self.tensors = lazy_allreduce.LaidOutTensors()
    self._owed_sums = []  # (mtf Tensor, LazyAllreduceSum) where the backend packs them
    # mtf Tensors the caller will export after lowering what it asked for (their owed
    # sums will be paid too, so they may join a packed collective)
    self.exported_later = set()
    self.operations = {}
    self._lowered = set()
    self._readers_of, self._readers_count = None, 0  # {mtf Tensor: ops reading it}
    self._counters = collections.Counter()
    self.comm_records = []  # CollectiveRecords of the ops this Lowering emitted
    speed_layer.refresh()  # the switch as the environment and gin say now
    self._check_meshes_and_layouts()
    self.variables = {}
    with tf.init_scope():
      for v in graph.all_variables:
        self.variables[v] = self._get_or_create_variable(v)
      # The random-op counter too (a variable made while tracing makes TF retrace);
      # not under a strategy's scope, which would make it a mirrored variable.
      for op in graph.operations:  # a while loop draws if its body does
        if getattr(op, "draws_random_steps", False) and not tf.distribute.has_strategy():
          self.mesh_impl(op).state.random_counter()

  def _check_meshes_and_layouts(self):
    """Validates every tensor's layout before any TF op is emitted."""
    for op in self.graph.operations:
      if op.mesh not in self.mesh_to_impl:
        raise LayoutError(
            "op %r is on %r, which has no MeshImpl in this Lowering (meshes given: %s)"
            % (op.name, op.mesh, list(self.mesh_to_impl)), op=op.name)
      impl = self.mesh_to_impl[op.mesh]
      for t in op.outputs:
        impl.tensor_layout(t.shape, tensor_name=t.name)

  def _get_or_create_variable(self, v):
    impl = self.mesh_impl(v)
    existing = impl.variable_store.get(v.name)
    if existing is None:
      existing = impl.make_variable(v)
      impl.variable_store[v.name] = existing
    elif (existing.shape != v.shape or existing.slice_dtype != v.slice_dtype):
      raise ShapeError(
          "variable %r already exists on %r with shape %s and dtype %s, but this graph "
          "asks for shape %s and dtype %s" % (v.name, impl, existing.shape.to_string,
                                              existing.slice_dtype.name, v.shape.to_string,
                                              v.slice_dtype.name), tensor=v.name)
    v.laid_out_variable = existing  # for Variable.get_master / assign_to_master
    return existing

  def mesh_impl(self, m):
    """The MeshImpl of a Mesh, or of the mesh of a Tensor or Operation."""
    return self.mesh_to_impl[getattr(m, "mesh", m)]

  # ---- on-demand lowering ----
  def _ensure_lowered(self, *ops):
    """Lowers ops and what they need, in graph order."""
    needed = set()
    stack = list(ops)
    while stack:
      o = stack.pop()
      if o in needed or o in self._lowered:
        continue
      needed.add(o)
      stack.extend(x.operation for x in o.inputs)
      stack.extend(getattr(o, "control_inputs", ()))
    if not needed:
      return
    for o in self.graph.operations:
      if o in needed:
        self._lower_one(o)

  def _lower_one(self, op):
    """Lowers one op, keeping the collectives it emitted in self.comm_records."""
    impl = self.mesh_impl(op)
    start = len(impl.comm_log)
    impl.current_op_name = op.name
    try:
      op.lower(self)
    finally:
      impl.current_op_name = None
    self.comm_records.extend(impl.comm_log[start:])
    self._lowered.add(op)

  def communication_summary(self):
    """Bytes each processor sends in what this Lowering emitted, by (kind, mesh dims).

    Returns an OrderedDict {(kind, "rows,cols"): bytes} (formulas: mesh_tf.analysis).
    """
    from mesh_tf.analysis import communication  # pylint: disable=g-import-not-at-top
    impl = next(iter(self.mesh_to_impl.values()))
    return communication.summarize(self.comm_records, impl.shape)

  def communication_report(self):
    """A printable table: op, collective, mesh dims, bytes sent per processor."""
    from mesh_tf.analysis import communication  # pylint: disable=g-import-not-at-top
    impl = next(iter(self.mesh_to_impl.values()))
    return communication.format_report(self.comm_records, impl.shape)

  @_no_autograph
  def lower_all(self):
    """Lowers every op of the graph (the original's constructor did this)."""
    for o in self.graph.operations:
      self._ensure_lowered(o)

  @_no_autograph
  def export_to_tf_tensor(self, x):
    """The full tf.Tensor value of mtf Tensor x."""
    self._ensure_lowered(x.operation)
    impl = self.mesh_impl(x)
    start = len(impl.comm_log)
    value = self.tensors[x]  # may pay an allreduce x still owes: it is recorded too
    self.comm_records.extend(impl.comm_log[start:])
    return impl.export_to_tf_tensor(x, value)

  @_no_autograph
  def lowered_operation(self, op):
    """Lowers op (e.g. an Assign) and returns what it produced (a tf op in graph mode)."""
    op = getattr(op, "operation", op)
    self._ensure_lowered(op)
    return self.operations.get(op)

  @property
  def counters(self):
    """{key: count} of what add_counter recorded (e.g. by op kind)."""
    return self._counters

  def set_tensor_lowering(self, tensor, laid_out_tensor):
    """Records the laid-out value of mtf Tensor `tensor`, checking its slice shapes."""
    x, laid_out = tensor, laid_out_tensor
    self.verify_slice_shapes(x, laid_out)
    if not isinstance(laid_out, (lazy_allreduce.LazyAllreduceSum,
                                 lazy_allreduce.LazyLaidOutTensor)):
      impl = self.mesh_impl(x)
      laid_out = impl.annotate(x, laid_out)
      impl.note_readers(laid_out, functools.partial(self._has_unlowered_reader, x))
    elif (isinstance(laid_out, lazy_allreduce.LazyAllreduceSum) and
          laid_out.mesh_impl.packs_allreduces):
      self._owed_sums.append((x, laid_out))
      laid_out.pack_partners_fn = functools.partial(self._pack_partners, laid_out)
    self.tensors[x] = laid_out

  def _pack_partners(self, lazy):
    """The other owed sums that will be paid anyway and can go in lazy's collective:
    unpaid, packable with it, and read by an op still to be lowered that pays them (not
    one that keeps them owed, as add_n or a reduce-scattering reshape may), or
    exported later."""
    partners = []
    for x, other in self._owed_sums:
      if (other is lazy or other.forced or not lazy_allreduce.packable(lazy, other) or
          self.tensors.raw(x) is not other):
        continue
      self._has_unlowered_reader(x)  # builds the readers map
      readers = [op for op in self._readers_of.get(x, ()) if op not in self._lowered]
      if x in self.exported_later or (readers and not any(
          getattr(op, "reads_owed_sums", False) for op in readers)):
        partners.append(other)
    self._owed_sums = [(x, s) for x, s in self._owed_sums if not s.forced]
    return partners

  def _has_unlowered_reader(self, x):
    """Whether an op reading mtf Tensor x is still to be lowered (or being lowered)."""
    if self._readers_of is None or self._readers_count != len(self.graph.operations):
      self._readers_of = collections.defaultdict(list)
      for op in self.graph.operations:
        for t in op.inputs:
          self._readers_of[t].append(op)
      self._readers_count = len(self.graph.operations)
    return any(op not in self._lowered for op in self._readers_of.get(x, ()))

  def verify_slice_shapes(self, tensor, laid_out_tensor):
    """Raises ShapeError unless the laid-out value has the layout's slice shape."""
    impl = self.mesh_impl(tensor)
    expected = impl.slice_shape(tensor.shape)
    actual = laid_out_tensor.slice_shape
    if actual is not None and list(actual) != expected:
      raise ShapeError("lowering of %s produced slices of shape %s, expected %s on %r"
                       % (tensor.name, actual, expected, impl), tensor=tensor.name)

  def laid_out_size(self, tensor):
    """Elements of `tensor` stored across all processors (counting replicas)."""
    return self.mesh_impl(tensor).laid_out_size(tensor.shape)

  def add_counter(self, key, value):
    self._counters[key] += int(value)

  # No-ops kept for the original's API: the slices are the only state (no master copies).
  def copy_masters_to_slices(self):
    return tf.no_op() if not tf.executing_eagerly() else None

  def copy_slices_to_masters(self):
    return tf.no_op() if not tf.executing_eagerly() else None

  def autostack(self):
    """No-op: variables are not stacked (kept for API compatibility)."""
