"""The models' view of layout: one `MeshLayout`, the one the backend lowers by.

The original's models and MoE layers take a `(layout, mesh_shape)` pair. Here the pair
is converted once, where it enters (`mesh_layout_of`), and layers read the model's
MeshLayout through `Context.mesh_layout`. The trainer passes the MeshImpl's own
MeshLayout as `layout`, so model and backend share one object; `check_agrees` refuses
to lower a model built for another layout.
"""
from mesh_tf.errors import LayoutError
from mesh_tf.shapes.mesh_layout import MeshLayout
from mesh_tf.shapes.shape import convert_to_shape


def mesh_layout_of(layout, mesh_shape=None):
  """The MeshLayout of the original's (layout, mesh_shape) pair, or None.

  layout may be a MeshLayout (returned as is; mesh_shape must then be None or its
  shape); otherwise None unless both layout and mesh_shape are given.
  """
  if isinstance(layout, MeshLayout):
    if mesh_shape is not None and convert_to_shape(mesh_shape) != layout.shape:
      raise LayoutError("mesh_shape %s disagrees with the mesh of layout %r"
                        % (convert_to_shape(mesh_shape).to_string, layout))
    return layout
  if layout is None or mesh_shape is None:
    return None
  return MeshLayout(mesh_shape, layout)


def split_size(mesh_layout, dim):
  """Over how many processors mesh_layout splits dim (1 without a layout)."""
  if mesh_layout is None:
    return 1
  axis = mesh_layout.tensor_dimension_to_mesh_axis(dim)
  return 1 if axis is None else mesh_layout.axis_size(axis)


def _same(a, b):
  """Equal mesh shapes and the same set of rules (rule order does not matter)."""
  return a.shape == b.shape and set(a.layout_rules) == set(b.layout_rules)


def check_agrees(model, mesh_impl):
  """Raises LayoutError when model (or its encoder/decoder) was built for a mesh shape
  or layout other than mesh_impl's. A model built without one agrees with any."""
  backend = MeshLayout.of(mesh_impl)
  parts = [model] + [getattr(model, n, None) for n in ("encoder", "decoder")]
  for part in parts:
    own = getattr(part, "mesh_layout", None)
    if own is None or own is backend or _same(own, backend):
      continue
    name = getattr(part, "name", type(part).__name__)
    raise LayoutError(
        "model %r was built for mesh shape %r and layout %r, but the %s lowering it "
        "has mesh shape %r and layout %r" % (
            name, own.shape.to_string, str(own.layout_rules), type(mesh_impl).__name__,
            backend.shape.to_string, str(backend.layout_rules)),
        rule=str(own.layout_rules),
        hint="build the model with layout=mesh_impl.mesh_layout (or the same "
             "mesh_shape and layout_rules as the MeshImpl)")
