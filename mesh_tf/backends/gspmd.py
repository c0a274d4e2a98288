"""`GSPMDMeshImpl`: each op lowered once on global tensors, annotated with XLA shardings.

Ops see every tensor whole (`slice_layout` splits no dim), so they emit no collective.
`tensor_layout` is the real, validated layout: the backend annotates each lowered tensor,
variable read and assigned value with its `mesh_split` sharding, and XLA's SPMD
partitioner splits the program (on TPU under `TPUStrategy`; on CPU/GPU
`tf.function(jit_compile=True)` runs it unpartitioned). Under TF 2.21's `TPUStrategy`
each variable is a full copy per core (see the README).
"""
import tensorflow as tf

from mesh_tf.backends import gspmd_sharding
from mesh_tf.lowering import laid_out_tensor
from mesh_tf.lowering.mesh_impl import LaidOutVariableBase, MeshImpl
from mesh_tf.lowering.reductions import canonical_reduction
from mesh_tf.shapes import convert_to_shape, list_product
from mesh_tf.shapes.mesh_layout import MeshLayout


class LaidOutTensor(laid_out_tensor.LaidOutTensor):
  """The one global tf.Tensor of an mtf Tensor (its slice shape is the full shape)."""

  def __init__(self, tensor_list):
    super().__init__(tensor_list)
    self.sharding = None  # the OpSharding this value already carries (set by annotate)

  @property
  def tensor(self):
    """The global tf.Tensor."""
    return self.tensor_list[0]


class LaidOutVariable(LaidOutVariableBase):
  """One full-shape tf.Variable per mtf Variable; reads and writes carry its sharding."""

  def __init__(self, variable, mesh_impl):
    self._mesh_impl = mesh_impl
    super().__init__(variable)
    self.sharding = mesh_impl.sharding_of(self.shape, self.name)
    initial = self.initial_full_value(variable)
    self.variable = tf.Variable(initial, name=gspmd_sharding.scope_name(self.name),
                                trainable=False)
    gspmd_sharding.annotate_variable(self.variable, self.sharding)

  @property
  def slice_variables(self):
    """The single full-shape tf.Variable (as a list, like the other backends)."""
    return [self.variable]

  def _annotated(self, value, what):
    return gspmd_sharding.annotate(
        value, self.sharding, gspmd_sharding.scope_name("%s_%s" % (self.name, what)))

  @property
  def laid_out_tensor(self):
    """The variable's value, annotated with its sharding."""
    out = LaidOutTensor([self._annotated(self.variable.read_value(), "read")])
    out.sharding = self.sharding
    return out

  def assign_to_slices(self, assign_fn, laid_out_values):
    """Applies assign_fn(variable, value) to the global value; returns the op."""
    value = self._annotated(tf.cast(laid_out_values.tensor, self.slice_dtype), "write")
    return [assign_fn(self.variable, value)]

  def read_full(self):
    """The whole variable as one tf.Tensor in its master dtype (for checkpoints)."""
    return tf.cast(self.variable.read_value(), self.master_dtype)

  def assign_full(self, value):
    """Sets the variable from a full-shape value (after a restore)."""
    self.variable.assign(tf.cast(value, self.slice_dtype))


class GSPMDMeshImpl(MeshImpl):
  """Mesh backend lowering to one global program annotated with XLA shardings.

  Args:
    shape: mesh shape ("rows:2;cols:4", a list of Dimensions or pairs).
    layout: layout rules ("batch:rows;hidden:cols" or pairs).
    device_assignment: None, a TPU DeviceAssignment whose cores per replica equal the
      mesh size, or a flat list of device ids (read as logical_to_physical).
    logical_to_physical: the device id of each processor in row-major processor order,
      e.g. from a TPU topology's core map (default: processor i on device i).
  """

  LaidOutTensor = LaidOutTensor
  LaidOutVariable = LaidOutVariable

  def __init__(self, shape, layout, device_assignment=None, logical_to_physical=None):
    super().__init__(shape, layout)
    self._device_assignment = device_assignment
    self._device_mesh = gspmd_sharding.make_device_mesh(
        self.shape, device_assignment, logical_to_physical)
    self._sharding_cache = {}
    self._whole_layout = MeshLayout(self.shape, [])

  @property
  def needs_xla(self):
    """True: the sharding annotations only take effect when XLA compiles the step."""
    return True

  @property
  def device_assignment(self):
    """The device_assignment given (e.g. the TPU DeviceAssignment), or None."""
    return self._device_assignment

  @property
  def device_mesh(self):
    """Device ids arranged in the mesh's shape (what `mesh_split` tiles over)."""
    return self._device_mesh

  @property
  def slice_layout(self):
    """Every dim whole: ops compute on global tensors (XLA partitions by tensor_layout)."""
    return self._whole_layout

  def sharding_of(self, shape, tensor_name=None):
    """The xla OpSharding of a tensor of this shape under this mesh's layout."""
    shape = convert_to_shape(shape)
    if shape not in self._sharding_cache:
      self._sharding_cache[shape] = gspmd_sharding.sharding_proto(
          self._device_mesh, self.tensor_layout(shape, tensor_name))
    return self._sharding_cache[shape]

  def annotate(self, x, laid_out):
    """laid_out with the sharding of mtf Tensor x attached (Lowering calls this)."""
    proto = self.sharding_of(x.shape, x.name)
    if getattr(laid_out, "sharding", None) == proto:
      return laid_out
    out = LaidOutTensor([gspmd_sharding.annotate(
        laid_out.tensor, proto, gspmd_sharding.scope_name(x.name))])
    out.sharding = proto
    return out

  # ---- primitives on global tensors ----
  def slicewise(self, fn, *inputs):
    """fn applied once, to the global tensors."""
    args = [x.tensor if isinstance(x, LaidOutTensor) else x for x in inputs]
    out = fn(*args)
    if isinstance(out, (tuple, list)):
      return tuple(LaidOutTensor([o]) for o in out)
    return LaidOutTensor([out])

  def record_collective(self, kind, mesh_axes, slice_shape, dtype):
    """Records nothing: this backend emits no collective (XLA inserts them)."""
    del kind, mesh_axes, slice_shape, dtype

  # Ops call collectives only on split dims, which GSPMD shows them none; one called
  # anyway means what it would where every processor holds the same value.
  def _allreduce(self, x, mesh_axes, reduction_fn_string):
    """Sum of n identical values is n times the value; MAX/MIN keep it."""
    reduction_fn_string = canonical_reduction(reduction_fn_string)
    if not mesh_axes or reduction_fn_string in ("MAX", "MIN"):
      return x
    n = self.processor_group_size(mesh_axes)
    return self.slicewise(lambda t: t * tf.cast(n, t.dtype), x)

  def _allconcat(self, x, mesh_axis, concat_axis):
    """n identical pieces, concatenated."""
    n = self.shape[mesh_axis].size
    return self.slicewise(lambda t: tf.concat([t] * n, concat_axis), x)

  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    """Processor 0's piece of each (identical) peer, concatenated."""
    n = self.shape[mesh_axis].size

    def first_piece_n_times(t):
      piece = tf.split(t, n, axis=split_axis)[0]
      return tf.concat([piece] * n, concat_axis)
    return self.slicewise(first_piece_n_times, x)

  def _receive(self, x, mesh_axis, source_pcoord):
    """Processor 0's receipt: the (identical) value, or zeros if it has no source."""
    if source_pcoord[0] is None:
      return self.slicewise(tf.zeros_like, x)
    return x

  def processor_group_size(self, mesh_axes):
    """Number of processors in each group that differs only on mesh_axes."""
    return list_product(self.shape[a].size for a in mesh_axes)

  def laid_out_pnum(self):
    """0: the global program is written from processor 0's point of view."""
    return LaidOutTensor([tf.constant(0, tf.int32)])

  def laid_out_pcoord(self, mesh_axis):
    """0 on every mesh axis (processor 0's view)."""
    del mesh_axis
    return LaidOutTensor([tf.constant(0, tf.int32)])

  def import_tf_tensor(self, x, tf_x):
    """The tf value itself (the Lowering hook annotates it)."""
    del x
    return LaidOutTensor([tf.convert_to_tensor(tf_x)])

  def export_to_tf_tensor(self, x, laid_out_x):
    """The global tensor, as it is."""
    del x
    return laid_out_x.tensor

  def make_variable(self, variable):
    """One full-shape tf.Variable, annotated with the variable's sharding."""
    return LaidOutVariable(variable, self)
