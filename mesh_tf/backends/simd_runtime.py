"""`SimdRuntime`: what a runtime of `SimdMeshImpl` implements (the CPU emulation in
simd_emulation.py, the TPU one in simd_tpu.py).

SimdMeshImpl holds the geometry and forwards its primitives here. A runtime's
collectives are not accounted: MeshImpl's public collectives record each one before
SimdMeshImpl calls the runtime, so a runtime calling its own collectives adds nothing
to `comm_log` (it calls the mesh's to be accounted).
"""
import abc

import tensorflow as tf


class SimdRuntime(abc.ABC):
  """The primitives of SimdMeshImpl on one runtime's laid-out tensors."""

  @abc.abstractmethod
  def LaidOutTensor(self, tensor_list):  # pylint: disable=invalid-name
    """This runtime's laid-out tensor from a tensor list (a class or a method)."""

  @abc.abstractmethod
  def slicewise(self, fn, *inputs):
    """MeshImpl.slicewise."""

  @abc.abstractmethod
  def allreduce(self, x, mesh_axes, reduction_fn_string):
    """MeshImpl._allreduce; mesh_axes is a list, the reduction name upper-case."""

  @abc.abstractmethod
  def allconcat(self, x, mesh_axis, concat_axis):
    """MeshImpl._allconcat."""

  @abc.abstractmethod
  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    """MeshImpl._alltoall."""

  @abc.abstractmethod
  def receive(self, x, mesh_axis, source_pcoord):
    """MeshImpl._receive."""

  @abc.abstractmethod
  def allsplit(self, x, mesh_axis, split_axis, which=None):
    """MeshImpl.allsplit."""

  @abc.abstractmethod
  def laid_out_pnum(self):
    """MeshImpl.laid_out_pnum."""

  @abc.abstractmethod
  def laid_out_pcoord(self, mesh_axis):
    """MeshImpl.laid_out_pcoord."""

  @abc.abstractmethod
  def laid_out_slice_begin(self, tensor_shape):
    """MeshImpl.laid_out_slice_begin."""

  @abc.abstractmethod
  def laid_out_slice_num(self, tensor_shape):
    """MeshImpl.laid_out_slice_num."""

  @abc.abstractmethod
  def import_tf_tensor(self, x, tf_x):
    """MeshImpl.import_tf_tensor."""

  def import_constant(self, x, value):
    """MeshImpl.import_constant; by default the constant's import_tf_tensor."""
    return self.import_tf_tensor(x, tf.constant(value))

  @abc.abstractmethod
  def export_to_tf_tensor(self, x, laid_out_x):
    """MeshImpl.export_to_tf_tensor."""

  @abc.abstractmethod
  def make_variable(self, variable):
    """MeshImpl.make_variable."""
