"""Deferred SUM allreduces, so that partial sums are added before they are reduced.

An einsum that contracts a split dim leaves each processor with a partial sum. When
several such partial sums are added (the gradient of a tensor used by three einsums, as
q, k and v use the attention input), allreducing their sum costs one collective instead
of three. An einsum therefore records a LazyAllreduceSum; `add_n` of lazy values with the
same mesh axes sums them locally and stays lazy; any other reader forces the allreduce
(once) through `Lowering.tensors`.
"""


class LazyAllreduceSum:
  """A laid-out value still owing a SUM allreduce over mesh_axes."""

  def __init__(self, mesh_impl, laid_out, mesh_axes, op_name):
    self.mesh_impl = mesh_impl
    self.laid_out = laid_out
    self.mesh_axes = tuple(mesh_axes)
    self.op_name = op_name  # collectives emitted by force() are accounted to this op
    self._result = None

  @property
  def slice_shape(self):
    return self.laid_out.slice_shape

  def force(self):
    """The allreduced value (emitted on first call, then reused)."""
    if self._result is None:
      impl = self.mesh_impl
      caller, impl.current_op_name = impl.current_op_name, self.op_name
      try:
        self._result = impl.allreduce(self.laid_out, list(self.mesh_axes), "SUM")
      finally:
        impl.current_op_name = caller
    return self._result


class LaidOutTensors(dict):
  """{mtf Tensor: laid-out value} whose reads force lazy allreduces; `raw` does not."""

  def __getitem__(self, x):
    value = dict.__getitem__(self, x)
    return value.force() if isinstance(value, LazyAllreduceSum) else value

  def get(self, x, default=None):
    return self[x] if x in self else default

  def raw(self, x):
    """The stored value, possibly a LazyAllreduceSum."""
    return dict.__getitem__(self, x)
