"""`Operation`: the base class of every mtf op.

An op does three things, kept together in its class: `__init__` infers output shapes and
dtypes and validates its inputs; `gradient(grad_ys)` returns mtf tensors; `lower(lowering)`
emits TF through the mesh primitives of its MeshImpl, never knowing which backend it is.
"""
from mesh_tf.errors import ShapeError
from mesh_tf.graph.tensor import Tensor


class Operation:
  """Base class of mtf operations."""

  def __init__(self, inputs, mesh=None, name=None):
    inputs = list(inputs)
    for i, x in enumerate(inputs):
      if not isinstance(x, Tensor):
        raise ShapeError("input %d of op %r is %r, not an mtf.Tensor; import TF values "
                         "with mtf.import_tf_tensor" % (i, name or type(self).__name__, x),
                         op=name)
    if mesh is None:
      if not inputs:
        raise ShapeError("op %r has no inputs, so it needs an explicit mesh" % name, op=name)
      mesh = inputs[0].mesh
    for x in inputs:
      if x.mesh is not mesh:
        raise ShapeError("op %r mixes meshes: input %s is on %r but the op is on %r; move "
                         "tensors between meshes explicitly" % (name, x.name, x.mesh, mesh),
                         op=name, tensor=x.name)
    self._inputs = inputs
    self._outputs = []
    self._mesh = mesh
    self._name = mesh.graph.unique_name(name or type(self).__name__)
    mesh.graph.add_operation(self)

  def __repr__(self):
    return "<%s %s>" % (type(self).__name__, self._name)

  @property
  def name(self):
    return self._name

  @property
  def inputs(self):
    return self._inputs

  @property
  def outputs(self):
    return self._outputs

  @property
  def mesh(self):
    return self._mesh

  @property
  def graph(self):
    return self._mesh.graph

  @property
  def has_gradient(self):
    """True when a float input could receive a gradient from a float output."""
    return (any(x.dtype.is_floating for x in self._inputs) and
            any(y.dtype.is_floating for y in self._outputs))

  def gradient(self, unused_grad_ys):
    """Returns a list (one per input) of mtf Tensors or None, given output gradients."""
    raise NotImplementedError("op %s (%s) has no gradient" % (self._name, type(self).__name__))

  def lower(self, lowering):
    """Emits TF for this op through `lowering.mesh_impl(self)` and records the outputs."""
    raise NotImplementedError("op %s (%s) cannot be lowered" % (self._name, type(self).__name__))

  # Splittability. Ops written against the original assign self._splittable_dims and
  # self._unsplittable_dims; the setters below keep them. An op that assigns nothing
  # reports every dim as splittable, less what its `unsplittable_dims` property names.

  @property
  def _splittable_dims(self):
    return self.splittable_dims

  @_splittable_dims.setter
  def _splittable_dims(self, names):
    self.__dict__["_declared_splittable"] = frozenset(names)

  @property
  def _unsplittable_dims(self):
    return self.unsplittable_dims

  @_unsplittable_dims.setter
  def _unsplittable_dims(self, names):
    self.__dict__["_declared_unsplittable"] = frozenset(names)

  def _all_dimension_names(self):
    return {n for t in list(self._inputs) + list(self._outputs)
            for n in t.shape.dimension_names}

  @property
  def splittable_dims(self):
    """Frozenset of the names of the dims this op may see split over the mesh."""
    declared = self.__dict__.get("_declared_splittable")
    if declared is not None:
      return declared
    return frozenset(self._all_dimension_names()) - self.unsplittable_dims

  @property
  def unsplittable_dims(self):
    """Frozenset of the names of the dims this op needs whole on every processor."""
    declared = self.__dict__.get("_declared_unsplittable")
    return frozenset() if declared is None else declared

  def _initialize_splittable_and_unsplittable_dims(self, default_splittability,
                                                   exception_dims_iterable=None):
    """(splittable, unsplittable): two frozensets of dim names of the inputs and outputs.

    Every dim name gets `default_splittability` ("splittable" or "unsplittable", else
    ValueError) except the names in exception_dims_iterable, which get the other one.
    Computes only; the caller stores the pair.
    """
    exceptions = frozenset(exception_dims_iterable or ())
    rest = frozenset(self._all_dimension_names()) - exceptions
    if default_splittability == "splittable":
      return rest, exceptions
    if default_splittability == "unsplittable":
      return exceptions, rest
    raise ValueError('default_splittability must be "splittable" or "unsplittable", '
                     "not %r" % (default_splittability,))

  def _initialize_all_dimensions_as_splittable(self):
    """(all dim names of the inputs and outputs, frozenset()): nothing needs to be whole."""
    return self._initialize_splittable_and_unsplittable_dims("splittable")

  @property
  def to_string(self):
    return "%s[%s] (%s) -> (%s)" % (
        type(self).__name__, self._name, ", ".join(x.name for x in self._inputs),
        ", ".join(repr(y) for y in self._outputs))

  def _add_output(self, shape, dtype):
    t = Tensor(self, shape, dtype, index=len(self._outputs))
    self._outputs.append(t)
    return t
