"""Deferred SUM allreduces, so that partial sums are added before they are reduced.

An einsum that contracts a split dim, or a reduce_sum over one, records a
LazyAllreduceSum of its partial sums;
`add_n` of lazy values with the same mesh axes sums them locally and stays lazy (one
collective instead of several); any other reader forces the allreduce (once) through
`Lowering.tensors`.
"""
import tensorflow as tf



class LazyAllreduceSum:
  """A laid-out value still owing a SUM allreduce over mesh_axes.

  Args:
    mesh_impl: the MeshImpl that will run the allreduce.
    laid_out_input: the laid-out partial sums.
    mesh_axes: the mesh axes to sum over.
    add_counter_fn: optional fn(key, value) told about the allreduce when it is emitted.
    op_name: the mtf op the collective is accounted to.
  """

  def __init__(self, mesh_impl, laid_out_input, mesh_axes, add_counter_fn=None,
               op_name=None):
    self.mesh_impl = mesh_impl
    self.laid_out = laid_out_input
    self.mesh_axes = tuple(mesh_axes)
    self.add_counter_fn = add_counter_fn
    self.op_name = op_name
    self._result = None
    # set by the Lowering where the backend packs allreduces: fn() -> other owed sums
    self.pack_partners_fn = None

  @property
  def slice_shape(self):
    return self.laid_out.slice_shape

  @property
  def forced(self):
    """Whether the allreduce has been emitted (a reader paid for it)."""
    return self._result is not None

  def force(self):
    """The allreduced value (emitted on first call, then reused)."""
    if self._result is None and self.pack_partners_fn is not None:
      partners = self.pack_partners_fn()
      if partners:
        _force_packed([self] + partners)
    if self._result is None:
      impl = self.mesh_impl
      caller, impl.current_op_name = impl.current_op_name, self.op_name
      try:
        self._paid(impl.allreduce(self.laid_out, list(self.mesh_axes), "SUM"))
      finally:
        impl.current_op_name = caller
    return self._result

  def _paid(self, result):
    self._result = result
    if self.add_counter_fn is not None:
      self.add_counter_fn("allreduce/%s/SUM" % list(self.mesh_axes), 1)

  def to_laid_out_tensor(self):
    """The original's name for force()."""
    return self.force()


def _force_packed(sums):
  """Pays the allreduces of LazyAllreduceSums owing the same SUM in one collective."""
  impl = sums[0].mesh_impl
  results = impl.allreduce_sums_packed([x.laid_out for x in sums], list(sums[0].mesh_axes),
                                       [x.op_name for x in sums])
  for x, result in zip(sums, results):
    x._paid(result)  # pylint: disable=protected-access


def packed(tensors):
  """One flat tensor of the tensors' elements, in order: a packed collective's input."""
  return tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)


def unpacked(flat, like):
  """Inverse of packed: tensors shaped as those of `like`, cut from flat."""
  pieces = tf.split(flat, [t.shape.num_elements() for t in like])
  return [tf.reshape(p, t.shape) for p, t in zip(pieces, like)]


def packable(x, y):
  """Whether owed sums x and y can be paid in one collective."""
  return (x.mesh_impl is y.mesh_impl and x.mesh_axes == y.mesh_axes and
          x.laid_out.dtype == y.laid_out.dtype)


class LazyLaidOutTensor:
  """A laid-out value computed only when first needed, by to_laid_out_tensor_fn()."""

  def __init__(self, to_laid_out_tensor_fn, slice_shape):
    self._fn = to_laid_out_tensor_fn
    self._slice_shape = slice_shape
    self._result = None

  @property
  def slice_shape(self):
    return self._slice_shape

  def to_laid_out_tensor(self):
    if self._result is None:
      self._result = self._fn()
    return self._result

  def force(self):
    return self.to_laid_out_tensor()


def compatible_lazy_allreduce_sums(xs):
  """Whether xs are all LazyAllreduceSums owing the same allreduce (so their sum may stay
  lazy)."""
  return bool(xs) and all(
      isinstance(x, LazyAllreduceSum) and x.mesh_impl is xs[0].mesh_impl and
      x.mesh_axes == xs[0].mesh_axes for x in xs)


def convert_args_to_laid_out_tensors(xs):
  """xs with every lazy value (LazyAllreduceSum, LazyLaidOutTensor) made concrete."""
  return [x.to_laid_out_tensor() if isinstance(x, (LazyAllreduceSum, LazyLaidOutTensor))
          else x for x in xs]


class LaidOutTensors(dict):
  """{mtf Tensor: laid-out value} whose reads force lazy allreduces; `raw` does not."""

  def __getitem__(self, x):
    value = dict.__getitem__(self, x)
    return value.force() if isinstance(value, (LazyAllreduceSum, LazyLaidOutTensor)) else value

  def get(self, x, default=None):
    return self[x] if x in self else default

  def raw(self, x):
    """The stored value, possibly a LazyAllreduceSum."""
    return dict.__getitem__(self, x)
