"""Choosing a backend by name: "placement", "simd" or "gspmd" (gin-configurable).

    impl = mtf.make_mesh_impl("gspmd", "rows:2;cols:4", "batch:rows;hidden:cols")

or, in a gin file, `make_mesh_impl.backend = "simd"` to switch a trainer's lowering
without touching its code. The same model then runs under each lowering.
"""
import gin

from mesh_tf.errors import LayoutError, MtfError
from mesh_tf.shapes import MeshLayout, convert_to_shape


def _placement(mesh_shape, layout, devices, **kwargs):
  from mesh_tf.backends.placement import PlacementMeshImpl  # pylint: disable=g-import-not-at-top
  return PlacementMeshImpl(mesh_shape, layout, devices, **kwargs)


def _simd(mesh_shape, layout, devices, **kwargs):
  from mesh_tf.backends.simd import SimdMeshImpl  # pylint: disable=g-import-not-at-top
  return SimdMeshImpl(mesh_shape, layout, devices=devices, **kwargs)


def _gspmd(mesh_shape, layout, devices, **kwargs):
  from mesh_tf.backends.gspmd import GSPMDMeshImpl  # pylint: disable=g-import-not-at-top
  size = (mesh_shape if isinstance(mesh_shape, MeshLayout)
          else convert_to_shape(mesh_shape)).size
  if devices is not None and len(devices) != size:
    raise LayoutError("mesh %s has %d processors but %d devices were given to the gspmd "
                      "backend" % (mesh_shape, size, len(devices)), mesh_dim=str(mesh_shape))
  # XLA places the partitions itself; the device list only fixes the mesh size.
  return GSPMDMeshImpl(mesh_shape, layout, **kwargs)


_BACKENDS = {"placement": _placement, "simd": _simd, "gspmd": _gspmd}


def backend_names():
  """Names make_mesh_impl accepts."""
  return sorted(_BACKENDS)


def register_backend(name, factory):
  """Adds a backend: factory(mesh_shape, layout, devices, **kwargs) -> MeshImpl."""
  _BACKENDS[name] = factory


@gin.configurable
def make_mesh_impl(backend="placement", mesh_shape="", layout="", devices=None, **kwargs):
  """A MeshImpl of the named backend for mesh_shape and layout.

  Args:
    backend: "placement" (one TF device per processor), "simd" (one core's program;
      CPU emulation or TPU) or "gspmd" (global program with XLA shardings).
    mesh_shape: e.g. "rows:2;cols:4", or a MeshLayout (then layout is None and the
      backend keeps that very object as its mesh_layout).
    layout: layout rules, e.g. "batch:rows;hidden:cols".
    devices: one device per processor (placement; others only check the count).
    **kwargs: passed to the backend (e.g. device_assignment, logical_to_physical).
  Raises:
    MtfError: unknown backend name.
  """
  if backend not in _BACKENDS:
    raise MtfError("unknown mesh backend %r; choose one of %s" % (backend, backend_names()))
  return _BACKENDS[backend](mesh_shape, layout, devices, **kwargs)
