"""Processor numbers <-> physical device coordinates, given a TPU device assignment.

The original's `pnum_to_processor_coordinates_nd` and
`processor_coordinates_to_pnum_map_nd`. A device assignment (anything with
`coordinates(replica, logical_core)`) places replica r at physical coordinates; processor
pnum runs as replica logical_to_physical[pnum]. Without one, the coordinates are the
logical mesh coordinates.
"""
from mesh_tf.shapes import list_product, pnum_to_processor_coordinates


def pnum_to_processor_coordinates_nd(mesh_shape, pnum, device_assignment):
  """The physical coordinates (a list) of the device running processor pnum."""
  if device_assignment is None:
    return pnum_to_processor_coordinates(mesh_shape, pnum)
  return [int(c) for c in device_assignment.coordinates(pnum, 0)]


def processor_coordinates_to_pnum_map_nd(mesh_shape, logical_to_physical,
                                         device_assignment):
  """{physical coordinates tuple: logical pnum} for every processor of the mesh."""
  sizes = [d.size if hasattr(d, "size") else d[1] for d in
           (mesh_shape.dims if hasattr(mesh_shape, "dims") else mesh_shape)]
  n = list_product(sizes)
  l2p = list(range(n)) if logical_to_physical is None else list(logical_to_physical)
  return {tuple(pnum_to_processor_coordinates_nd(mesh_shape, l2p[pnum], device_assignment)
                if device_assignment is not None else
                pnum_to_processor_coordinates(mesh_shape, pnum)): pnum
          for pnum in range(n)}
