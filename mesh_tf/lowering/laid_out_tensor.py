"""`LaidOutTensor`: the base of every backend's value for one mtf Tensor, and its protocol.

Ops never look inside a laid-out tensor; they pass it to MeshImpl primitives. What user
code (and `import_laid_out_tensor`, `Print`, control dependencies) may rely on:

- `tensor_list`: the backend's tf.Tensors for the value -- placement: one slice per
  processor, by processor number; SIMD on TPU: this core's one slice; SIMD emulation: one
  stacked [cores, *slice] tensor in physical core order; GSPMD: the one global tensor.
- `all_slices`: the same list (the original's name).
- `slice_shape`: the shape (list of ints) of one processor's slice under the backend's
  `MeshImpl.slice_layout` (GSPMD: the full shape).
- `dtype`: the tf.DType of its slices.
- `to_laid_out_tensor()`: the value itself (lazy values compute themselves first).
"""


class LaidOutTensor(object):
  """Holds `tensor_list`; subclasses add backend-specific views and checks."""

  def __init__(self, tensor_list):
    self.tensor_list = list(tensor_list)

  def __repr__(self):
    return "%s(%d tensor(s), slice %s)" % (type(self).__name__, len(self.tensor_list),
                                           self.slice_shape)

  @property
  def all_slices(self):
    """The backend's tf.Tensors for this value (see the module docstring)."""
    return self.tensor_list

  @property
  def one_slice(self):
    """The first (for one-tensor backends, the only) tf.Tensor."""
    return self.tensor_list[0]

  @property
  def slice_shape(self):
    """One processor's slice shape, as a list of ints."""
    return self.one_slice.shape.as_list()

  @property
  def dtype(self):
    """The tf.DType of its slices."""
    return self.one_slice.dtype

  def to_laid_out_tensor(self):
    """Itself."""
    return self
