"""Errors raised by mesh_tf, worded in one place.

Every error a user can cause with a bad shape, layout, mesh or checkpoint is an
`MtfError` (a `ValueError`, as in the original), carrying what it is about as attributes.
"""


class MtfError(ValueError):
  """A ValueError that names the op, tensor, dimension, mesh dimension or rule involved.

  Attributes:
    op, tensor, dim, mesh_dim, rule, file: whatever of these the failure is about
      (None where it does not apply).
  """

  def __init__(self, message, op=None, tensor=None, dim=None, mesh_dim=None,
               rule=None, file=None, hint=None):
    self.op = op
    self.tensor = tensor
    self.dim = dim
    self.mesh_dim = mesh_dim
    self.rule = rule
    self.file = file
    if hint:
      message = "%s -- %s" % (message, hint)
    super().__init__(message)


class LayoutError(MtfError):
  """A layout rule cannot be applied to a tensor on a mesh."""


class ShapeError(MtfError):
  """Shapes, dimension names or dtypes do not fit together."""


class CheckpointError(MtfError):
  """A checkpoint is missing, corrupt, or does not match the variables."""


class NonFiniteError(MtfError):
  """A loss or variable holds NaN or Inf where only finite values may go on."""
