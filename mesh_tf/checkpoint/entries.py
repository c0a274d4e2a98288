"""What a checkpoint holds: named entries from lowerings, mesh impls and tf.Variables.

An entry is one checkpoint key. It knows its full shape and stored dtype, how to read its
full value and how to write one back, whether its state is a laid-out mtf variable (split
over a mesh) or a plain `tf.Variable` (the global step, an optimizer counter, ...).
A laid-out variable is any backend object with `shape` (an mtf Shape), `master_dtype`,
`read_full()` and `assign_full(value)`.
"""
import tensorflow as tf

from mesh_tf.errors import CheckpointError


class Entry:
  """One checkpoint key (`name`) and the laid-out variable or tf.Variable behind it
  (`state`); `shape` is the full shape (ints), `dtype` the stored tf.DType (an mtf
  variable's master dtype)."""

  def __init__(self, name, state):
    self.name = name
    self.state = state
    if hasattr(state, "read_full"):
      self.shape = list(state.shape.to_integer_list)
      self.dtype = tf.as_dtype(state.master_dtype)
    else:
      self.shape = state.shape.as_list()
      self.dtype = tf.as_dtype(state.dtype)

  def __repr__(self):
    return "Entry(%r, %s, %s)" % (self.name, self.shape, self.dtype.name)

  def read(self):
    """The full value, in the stored dtype."""
    if hasattr(self.state, "read_full"):
      return self.state.read_full()
    return tf.cast(self.state.read_value(), self.dtype)

  def write(self, value):
    """Sets the state from a full value (cast to the stored dtype first)."""
    value = tf.cast(value, self.dtype)
    if hasattr(self.state, "read_full"):
      self.state.assign_full(value)
    else:
      self.state.assign(value)


class SliceEntry(Entry):
  """Entry `index` along the first dim of a laid-out variable that a checkpoint stores
  as one key per entry of that dim (see `collect_entries`)."""

  def __init__(self, name, state, index):
    super().__init__(name, state)
    self.index = index
    self.shape = self.shape[1:]

  def __repr__(self):
    return "SliceEntry(%r, %s[%d], %s)" % (self.name, self.state.name, self.index,
                                          self.dtype.name)

  def read(self):
    return self.state.read_full()[self.index]

  def write(self, value):
    full = self.state.read_full()
    value = tf.cast(value, full.dtype)[tf.newaxis]
    self.state.assign_full(tf.concat([full[:self.index], value, full[self.index + 1:]],
                                     0))


def _split_names(states):
  """{name: checkpoint keys} of the states stored as one key per entry of their first
  dim: laid-out variables with a `checkpoint_split` list of names, and those named like
  one of them plus a suffix (its optimizer slots, "<var>_slot_vr") whose first dim is
  the same, which are split into the names plus that suffix."""
  splits = {name: list(state.checkpoint_split) for name, state in states.items()
            if getattr(state, "checkpoint_split", None)}
  out = dict(splits)
  for name, state in states.items():
    if name in splits or not hasattr(state, "read_full") or not state.shape.dims:
      continue
    bases = [b for b in splits if name.startswith(b) and
             states[b].shape.dims[0] == state.shape.dims[0]]
    if bases:
      base = max(bases, key=len)
      out[name] = [n + name[len(base):] for n in splits[base]]
  for name, names in out.items():
    if len(names) != states[name].shape.dims[0].size:
      raise CheckpointError("variable %r has %d checkpoint names for its first dim %s"
                            % (name, len(names), states[name].shape.dims[0]), tensor=name)
  return out


def _variable_dicts(source):
  """Yields dicts name -> state from a Lowering, MeshImpl, dict, or a list of those."""
  if isinstance(source, dict):
    yield source
  elif hasattr(source, "mesh_to_impl"):
    for impl in source.mesh_to_impl.values():
      yield impl.variable_store
  elif hasattr(source, "variable_store"):
    yield source.variable_store
  elif isinstance(source, (list, tuple)):
    for s in source:
      yield from _variable_dicts(s)
  else:
    raise CheckpointError(
        "cannot take checkpoint variables from %r; give a mtf.Lowering, a MeshImpl, a "
        "dict name -> variable, or a list of these" % (source,))


def collect_entries(source, extra_variables=None):
  """A dict checkpoint key -> Entry, sorted by key.

  source: a Lowering (every variable of every mesh it lowers to), a MeshImpl (its
  `variable_store`), a dict name -> laid-out variable or tf.Variable, a list of these, or
  None; extra_variables: optional dict name -> tf.Variable saved beside them. A laid-out
  variable with a `checkpoint_split` list of names (a pipeline's stacked stage weights)
  and its optimizer slots are stored as one key per entry of the first dim. Raises
  CheckpointError if two different states claim the same name.
  """
  states = {}
  dicts = list(_variable_dicts(source)) if source is not None else []
  for d in dicts + [extra_variables or {}]:
    for name, state in d.items():
      if name in states and states[name] is not state:
        raise CheckpointError("two different variables are named %r; checkpoint keys "
                              "must be unique" % name, tensor=name)
      states[name] = state
  entries, split = {}, _split_names(states)
  for name, state in states.items():
    keys = split.get(name, [name])
    for i, key in enumerate(keys):
      if key in entries or (key != name and key in states):
        raise CheckpointError("two different variables are named %r; checkpoint keys "
                              "must be unique" % key, tensor=key)
      entries[key] = SliceEntry(key, state, i) if name in split else Entry(key, state)
  return {name: entries[name] for name in sorted(entries)}
