"""The models' view of layout: one `MeshLayout`, the one the backend lowers by.

The original's models and MoE layers take a `(layout, mesh_shape)` pair; it is converted
once, where it enters (`mesh_layout_of`), and layers read `Context.mesh_layout`. The
trainer passes the MeshImpl's own MeshLayout as `layout`; `check_agrees` refuses to
lower a model built for another layout.
"""
from mesh_tf.errors import LayoutError
from mesh_tf.shapes.mesh_layout import MeshLayout


def mesh_layout_of(layout, mesh_shape=None):
  """The MeshLayout of the original's (layout, mesh_shape) pair (None unless both are
  given), or layout itself when it is a MeshLayout (mesh_shape must then agree)."""
  if isinstance(layout, MeshLayout):
    if mesh_shape is not None and MeshLayout(mesh_shape).shape != layout.shape:
      raise LayoutError("mesh_shape %s disagrees with the mesh of %r"
                        % (MeshLayout(mesh_shape).shape.to_string, layout))
    return layout
  if layout is None or mesh_shape is None:
    return None
  return MeshLayout(mesh_shape, layout)


def split_size(mesh_layout, dim):
  """Over how many processors mesh_layout splits dim (1 without a layout)."""
  axis = mesh_layout and mesh_layout.tensor_dimension_to_mesh_axis(dim)
  return 1 if axis is None else mesh_layout.axis_size(axis)


def check_agrees(model, mesh_impl):
  """Raises LayoutError when model (or its encoder/decoder) was built for another mesh
  shape or other rules than mesh_impl's (rule order aside); a model without any agrees."""
  backend = MeshLayout.of(mesh_impl)
  for part in [model, getattr(model, "encoder", None), getattr(model, "decoder", None)]:
    own = getattr(part, "mesh_layout", None)
    if own is None or (own.shape == backend.shape
                       and set(own.layout_rules) == set(backend.layout_rules)):
      continue
    raise LayoutError(
        "model %r was built for mesh shape %r and layout %r, but the %s lowering it "
        "has mesh shape %r and layout %r" % (
            getattr(part, "name", type(part).__name__), own.shape.to_string,
            str(own.layout_rules), type(mesh_impl).__name__, backend.shape.to_string,
            str(backend.layout_rules)),
        rule=str(own.layout_rules),
        hint="build the model with layout=mesh_impl.mesh_layout")
