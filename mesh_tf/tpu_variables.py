"""The original's `mesh_tensorflow.tpu_variables`: one variable kept in several copies.

`ReplicatedVariable(name, variables)` groups per-replica copies of one variable behind
the interface of a single variable: reads give the primary copy (the first; under a
`tf.distribute` replica context, that replica's); assigns update every copy.
"""
import tensorflow as tf


class ReplicatedVariable:
  """A variable stored as a list of equal copies (one per replica).

  Args:
    name: the variable's name.
    variables: the per-replica tf.Variables, all of one shape and dtype.
  """

  def __init__(self, name, variables):
    variables = list(variables)
    if not variables:
      raise ValueError("ReplicatedVariable %r needs at least one copy" % name)
    first = variables[0]
    for v in variables[1:]:
      if v.shape != first.shape or v.dtype != first.dtype:
        raise ValueError("ReplicatedVariable %r: copy %s has shape %s, dtype %s but the "
                         "first has %s, %s" % (name, v.name, v.shape, v.dtype.name,
                                               first.shape, first.dtype.name))
    self._name = name
    self._vars = variables
    self._primary_var = first

  def get(self):
    """The copy this replica reads (the current replica's, else the primary one)."""
    context = tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync == len(self._vars):
      replica_id = tf.get_static_value(context.replica_id_in_sync_group)
      if replica_id is not None:
        return self._vars[int(replica_id)]
    return self._primary_var

  @property
  def variables(self):
    """The per-replica copies."""
    return list(self._vars)

  @property
  def name(self):
    return self._name

  @property
  def dtype(self):
    return self._primary_var.dtype

  @property
  def shape(self):
    return self._primary_var.shape

  def get_shape(self):
    return self._primary_var.shape

  @property
  def handle(self):
    return self.get().handle

  @property
  def graph(self):
    return getattr(self._primary_var, "graph", None)

  @property
  def op(self):
    """The primary copy's op (graph mode); None when eager, as for a tf.Variable."""
    try:
      return self._primary_var.op
    except (AttributeError, RuntimeError):
      return None

  @property
  def initializer(self):
    """Initializes every copy (graph mode); None when eager (copies start initialized)."""
    if tf.executing_eagerly():
      return None
    return tf.group(*[v.initializer for v in self._vars])

  @property
  def constraint(self):
    return self._primary_var.constraint

  def read_value(self):
    return self.get().read_value()

  def _for_all(self, method, value, read_value, name):
    ops = [getattr(v, method)(value, read_value=False) for v in self._vars]
    if read_value:
      if ops and not tf.executing_eagerly():
        with tf.control_dependencies([o for o in ops if o is not None]):
          return tf.identity(self.get().read_value(), name=name)
      return self.get().read_value()
    if tf.executing_eagerly():
      return None
    return tf.group(*ops, name=name)

  def assign(self, value, use_locking=None, name=None, read_value=False):
    """Sets every copy to value."""
    del use_locking
    return self._for_all("assign", value, read_value, name)

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    """Adds delta to every copy."""
    del use_locking
    return self._for_all("assign_add", delta, read_value, name)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    """Subtracts delta from every copy."""
    del use_locking
    return self._for_all("assign_sub", delta, read_value, name)

  def to_proto(self, export_scope=None):
    """TF1 graph serialization; variables are saved by tf.train.Checkpoint in TF 2."""
    raise NotImplementedError(
        "ReplicatedVariable %r: to_proto(export_scope=%r) is TF1 MetaGraph serialization, "
        "which TF 2 does not have; save the copies with tf.train.Checkpoint"
        % (self._name, export_scope))

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    del as_ref
    value = self.get().read_value()
    if dtype is not None and dtype != value.dtype:
      value = tf.cast(value, dtype)
    return tf.identity(value, name=name) if name else value

  def __repr__(self):
    return "<ReplicatedVariable %r: %d copies of %s %s>" % (
        self._name, len(self._vars), self.shape, self.dtype.name)


tf.register_tensor_conversion_function(
    ReplicatedVariable,
    lambda v, dtype=None, name=None, as_ref=False: v._dense_var_to_tensor(  # pylint: disable=protected-access
        dtype, name, as_ref))
