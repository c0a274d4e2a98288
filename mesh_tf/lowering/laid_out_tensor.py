"""`LaidOutTensor`: the base of every backend's value for one mtf Tensor, and its protocol.

Ops never look inside a laid-out tensor; they pass it to MeshImpl primitives. Its
`tensor_list` (alias `all_slices`) holds the backend's tf.Tensors for the value --
placement: one slice per processor, by pnum; SIMD on TPU: this core's slice; SIMD
emulation: one stacked [cores, *slice] tensor in physical core order; GSPMD: the one
global tensor.
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
    """One processor's slice shape (list of ints) under `MeshImpl.slice_layout`."""
    return self.one_slice.shape.as_list()

  @property
  def dtype(self):
    """The tf.DType of its slices."""
    return self.one_slice.dtype

  def to_laid_out_tensor(self):
    """Itself."""
    return self
