"""The mtf Graph: an ordered list of operations plus naming and variable bookkeeping.

Building a graph creates Python objects only; nothing touches TensorFlow until a
`Lowering` emits TF ops for it.
"""
import contextlib
import threading

import tensorflow as tf

class _ScopeState(threading.local):
  """Per thread: the names and reuse flags of the open mtf.variable_scopes."""

  def __init__(self):
    super().__init__()
    self.stack = []
    self.reuse = []


_scope_state = _ScopeState()


@contextlib.contextmanager
def variable_scope(name, reuse=None):
  """Prefixes the names of ops and variables created inside with `name/` (the original's
  `tf.variable_scope`; `tf.compat.v1.variable_scope` is honoured too).

  With reuse=True (or tf.compat.v1.AUTO_REUSE), mtf.get_variable inside returns the
  graph's existing variable of the same full name instead of raising (weight sharing);
  reuse=False turns reuse off again inside a reusing scope.
  """
  _scope_state.stack.append(name)
  _scope_state.reuse.append(reuse)
  try:
    yield
  finally:
    _scope_state.stack.pop()
    _scope_state.reuse.pop()


def reuse_variables():
  """Whether the innermost mtf.variable_scope that says so asked to reuse variables (TF's
  own variable scopes are not consulted: eagerly they always report AUTO_REUSE)."""
  for r in reversed(_scope_state.reuse):
    if r is not None:
      return bool(r)
  return False


name_scope = variable_scope


def current_scope_name():
  """The active scope prefix (without a trailing slash), or ""."""
  parts = []
  tf_scope = tf.compat.v1.get_variable_scope().name
  if tf_scope:
    parts.append(tf_scope)
  parts.extend(p for p in _scope_state.stack if p)
  return "/".join(parts)


class Graph:
  """A graph of mtf operations, kept in creation order (which is a valid topological order)."""

  def __init__(self):
    self._operations = []
    self._trainable_variables = []
    self._all_variables = []
    self._names_in_use = {}
    self._variable_names = {}
    self._custom_getters = []

  def __repr__(self):
    return "<mtf.Graph with %d operations>" % len(self._operations)

  @property
  def operations(self):
    """All operations, in the order they were created."""
    return self._operations

  @property
  def trainable_variables(self):
    """The trainable `Variable` operations."""
    return self._trainable_variables

  @property
  def all_variables(self):
    """Every `Variable` operation, trainable or not."""
    return self._all_variables

  def add_operation(self, op):
    self._operations.append(op)

  @contextlib.contextmanager
  def custom_getter(self, getter):
    """Inside, mtf.get_variable on this graph calls getter(next_getter, mesh, name,
    shape, **kwargs) instead; next_getter (same arguments) is the next getter out, the
    last one the plain get_variable."""
    self._custom_getters.append(getter)
    try:
      yield
    finally:
      self._custom_getters.remove(getter)

  @property
  def custom_getters(self):
    """The active getters of `custom_getter`, outermost first."""
    return list(self._custom_getters)

  def variable_by_name(self, full_name):
    """The Variable op with this full name, or None."""
    return self._variable_names.get(full_name)

  def add_variable(self, variable):
    """Registers a Variable op; two variables with one name would share a checkpoint key."""
    if variable.name in self._variable_names:
      from mesh_tf.errors import ShapeError  # pylint: disable=g-import-not-at-top
      raise ShapeError(
          "variable %r already exists in this graph (shape %s); variable names must be "
          "unique -- wrap the second one in mtf.variable_scope(...) or pick another name"
          % (variable.name, self._variable_names[variable.name].shape), tensor=variable.name)
    self._variable_names[variable.name] = variable
    self._all_variables.append(variable)
    if variable.trainable:
      self._trainable_variables.append(variable)

  def make_variables_untrainable(self, variables):
    """Removes the given Variable ops from `trainable_variables`."""
    drop = {id(v) for v in variables}
    self._trainable_variables = [v for v in self._trainable_variables if id(v) not in drop]
    for v in variables:
      v._trainable = False  # pylint: disable=protected-access

  def unique_name(self, name, mark_as_used=True):
    """Scoped, case-insensitively unique name: "foo", then "foo_1", "foo_2", ... (as TF:
    if "foo_1" was taken explicitly, the next "foo" skips to "foo_2")."""
    scope = current_scope_name()
    if scope:
      name = scope + "/" + name
    key = name.lower()
    i = self._names_in_use.get(key, 0)
    if mark_as_used:
      self._names_in_use[key] = i + 1
    if i == 0:
      return name
    base_key = key
    while key in self._names_in_use:
      key = "%s_%d" % (base_key, i)
      i += 1
    if mark_as_used:
      self._names_in_use[key] = 1
    return "%s_%d" % (name, i - 1)

  def capture_operations(self, fn):
    """Runs fn() and returns (its result, the operations it created)."""
    n = len(self._operations)
    result = fn()
    return result, self._operations[n:]

  def clone_operations(self, ops, input_mapping):
    """Re-creates `ops` (in order) reading the replacements given by input_mapping.

    Returns (the new operations, input_mapping updated to map every old tensor to its
    copy). Ops without inputs (variables, constants, random ops) are shared, not copied.
    """
    from mesh_tf.ops.custom_gradient import clone_operations  # pylint: disable=g-import-not-at-top
    mapping, new_ops = self.capture_operations(
        lambda: clone_operations(self, ops, input_mapping))
    input_mapping.update(mapping)
    return new_ops, input_mapping

  def combine_assignments(self, assignments):
    """Merges Assign operations that share an assign_fn into one Assign each; returns the
    merged Assign operations (use them instead of the originals)."""
    from mesh_tf.ops.assign import Assign  # pylint: disable=g-import-not-at-top
    groups = {}
    for a in assignments:
      if not isinstance(a, Assign):
        raise TypeError("combine_assignments takes Assign operations, got %r" % (a,))
      variables, values = groups.setdefault(a.assign_fn, ([], []))
      variables.extend(a.variables)
      values.extend(a.inputs)
    return [Assign(variables, values, assign_fn=fn)
            for fn, (variables, values) in groups.items()]

  def rewrite_stack_variables(self, max_combined_variable_size=2 ** 29,
                              max_combined_slice_size=2 ** 27, mesh_to_impl=None):
    """Kept for the original's API; leaves the graph as it is (variables are not
    stacked: each keeps its own state and name, which checkpoints rely on)."""
    del max_combined_variable_size, max_combined_slice_size, mesh_to_impl

  @property
  def to_string(self):
    """A line per operation: its name, inputs and output shapes."""
    return "\n".join(op.to_string for op in self._operations)
