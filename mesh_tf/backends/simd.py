"""`SimdMeshImpl`: one program written from the point of view of a single core.

As on a TPU, every core runs the same program on its own slices and communicates by
collectives over groups of cores. This class holds the geometry (the mesh, the
logical-to-physical core map, the group assignments) and hands the primitives to a
`simd_runtime.SimdRuntime`: the TPU runtime (`simd_tpu`) when a TPU `device_assignment`
is given, else the CPU emulation (`simd_emulation`).
"""
import types

import tensorflow as tf

from mesh_tf.backends import simd_emulation
from mesh_tf.backends.tpu_topology import check_permutation, inverse_permutation
from mesh_tf.errors import LayoutError
from mesh_tf.lowering import laid_out_tensor
from mesh_tf.lowering.mesh_impl import MeshImpl
from mesh_tf.lowering.reductions import canonical_reduction
from mesh_tf.shapes import convert_to_shape


class LaidOutTensor(laid_out_tensor.LaidOutTensor):
  """One core's slice of an mtf Tensor (the TPU runtime's laid-out tensor)."""

  def __init__(self, tensor_list):
    super().__init__(tensor_list)
    if len(self.tensor_list) != 1:
      raise LayoutError("a SIMD laid-out tensor holds this core's one slice, got a list of "
                        "%d tensors" % len(self.tensor_list))


def _num_replicas(device_assignment):
  n = getattr(device_assignment, "num_replicas", None)
  return n if n is not None else len(device_assignment)


class SimdMeshImpl(MeshImpl):
  """Mesh backend in the SIMD (single program, one core's view) style.

  Args:
    shape: mesh shape ("rows:8;cols:8", a list of Dimensions or pairs).
    layout: layout rules.
    devices: accepted for compatibility (the original ignored them too); if given, one
      entry per core.
    device_assignment: a tf.tpu.experimental.DeviceAssignment with one replica per core:
      selects the TPU runtime. None runs the CPU emulation.
    logical_to_physical: permutation of range(mesh size); l2p[logical pnum] is the
      physical core (replica id) playing that processor. Default: identity.
    allreduce_in_bfloat16_max_group_size: bfloat16 allreduces over larger groups are
      summed in float32 (TPU runtime).
  """

  LaidOutTensor = LaidOutTensor
  # The replay (simd_vectorize) vectorizes the one einsum op and picks its kernel.
  einsum_as_matmul = False

  def __init__(self, shape, layout, devices=None, device_assignment=None,
               logical_to_physical=None, allreduce_in_bfloat16_max_group_size=8):
    super().__init__(shape, layout)
    mesh = self.shape.to_string or "[]"
    if devices is not None and len(devices) != self.size:
      raise LayoutError("mesh %s has %d cores but %d devices were given"
                        % (mesh, self.size, len(devices)))
    if device_assignment is not None and _num_replicas(device_assignment) != self.size:
      raise LayoutError(
          "mesh %s has %d cores but the device assignment has %d replicas; SIMD runs one "
          "replica per core" % (mesh, self.size, _num_replicas(device_assignment)))
    if logical_to_physical is None:
      logical_to_physical = list(range(self.size))
    self._l2p = check_permutation(logical_to_physical, self.size, mesh)
    self._p2l = inverse_permutation(self._l2p)
    self._devices = devices
    self._device_assignment = device_assignment
    self.allreduce_in_bfloat16_max_group_size = allreduce_in_bfloat16_max_group_size
    if device_assignment is None:
      self._runtime = simd_emulation.EmulationRuntime(self)
    else:
      from mesh_tf.backends import simd_tpu  # pylint: disable=g-import-not-at-top
      self._runtime = simd_tpu.TpuRuntime(self)
    # The laid-out tensor class of this instance's runtime.
    self.LaidOutTensor = self._runtime.LaidOutTensor  # pylint: disable=invalid-name

  # ---- geometry ----
  @property
  def is_emulated(self):
    """True when this mesh runs on the CPU emulation runtime."""
    return self._device_assignment is None

  @property
  def devices(self):
    return self._devices

  @property
  def device_assignment(self):
    return self._device_assignment

  @property
  def logical_to_physical(self):
    return list(self._l2p)

  def l2p(self, logical_pnum):
    """Physical core of a logical processor number."""
    return self._l2p[logical_pnum]

  def p2l(self, physical_pnum):
    """Logical processor number of a physical core."""
    return self._p2l[physical_pnum]

  def _create_group_assignment(self, mesh_axes):
    """Groups of PHYSICAL core ids for a collective over mesh_axes (processor_groups)."""
    return [[self._l2p[p] for p in group] for group in self.processor_groups(mesh_axes)]

  # ---- primitives (delegated to the runtime; MeshImpl records the collectives) ----
  def slicewise(self, fn, *inputs):
    return self._runtime.slicewise(fn, *inputs)

  def _allreduce(self, x, mesh_axes, reduction_fn_string):
    return self._runtime.allreduce(x, list(mesh_axes),
                                   canonical_reduction(reduction_fn_string))

  def allconcat(self, x, mesh_axis, concat_axis, stack=False):
    """Gathers the group's slices along mesh_axis: concatenated on concat_axis, or (with
    stack=True) stacked on a new axis at concat_axis."""
    if stack:
      x = self.slicewise(lambda t: tf.expand_dims(t, concat_axis), x)
    return super().allconcat(x, mesh_axis, concat_axis)

  def _allconcat(self, x, mesh_axis, concat_axis):
    return self._runtime.allconcat(x, mesh_axis, concat_axis)

  def _alltoall(self, x, mesh_axis, split_axis, concat_axis):
    return self._runtime.alltoall(x, mesh_axis, split_axis, concat_axis)

  def _receive(self, x, mesh_axis, source_pcoord):
    return self._runtime.receive(x, mesh_axis, source_pcoord)

  def allsplit(self, x, mesh_axis, split_axis, which=None):
    return self._runtime.allsplit(x, mesh_axis, split_axis, which)

  def control_tensors(self, laid_out):
    # the emulation's compact form waits for the value without broadcasting it
    compact = getattr(laid_out, "compact", None)
    return [compact] if compact is not None else list(laid_out.all_slices)

  def laid_out_pnum(self):
    return self._runtime.laid_out_pnum()

  @property
  def pnum_tensor(self):
    """This core's logical processor number as a TF int32 value. On the emulation, where
    one program runs every core, it holds every core's: [num_cores] in physical order."""
    return self.laid_out_pnum().one_slice

  def slice(self, tf_tensor, tensor_shape):
    """This core's slice of a full tf_tensor of mtf shape tensor_shape (emulation:
    [num_cores, *slice_shape], every core's slice in physical order)."""
    holder = types.SimpleNamespace(shape=convert_to_shape(tensor_shape), name="slice")
    return self.import_tf_tensor(holder, tf_tensor).one_slice

  def laid_out_pcoord(self, mesh_axis):
    return self._runtime.laid_out_pcoord(mesh_axis)

  def laid_out_slice_begin(self, tensor_shape):
    return self._runtime.laid_out_slice_begin(tensor_shape)

  def laid_out_slice_num(self, tensor_shape):
    return self._runtime.laid_out_slice_num(tensor_shape)

  def import_tf_tensor(self, x, tf_x):
    return self._runtime.import_tf_tensor(x, tf_x)

  def import_constant(self, x, value):
    return self._runtime.import_constant(x, value)

  def export_to_tf_tensor(self, x, laid_out_x):
    return self._runtime.export_to_tf_tensor(x, laid_out_x)

  def make_variable(self, variable):
    return self._runtime.make_variable(variable)
