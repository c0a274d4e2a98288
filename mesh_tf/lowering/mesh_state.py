"""The TF state of a mesh -- its laid-out variables and its random-op step counter.

Usually a MeshImpl owns its state. But each trace of a tf.function that builds its
MeshImpl inside makes a new one, and new variables on a later trace are an error. So a
MeshImpl constructed *while a tf.function traces* shares its state with every MeshImpl
built in a trace of the same tf.function object with the same backend, mesh shape,
layout and devices: variables are created on the first trace and reused after.
"""
import sys
import weakref

import tensorflow as tf

# tf.function object -> {backend key: MeshState}, for MeshImpls built inside its traces.
_STATES_BY_FUNCTION = weakref.WeakKeyDictionary()
# FuncGraph name -> {backend key: MeshState}, for traces with no tf.function object.
_TRACED_STATES = {}


class MeshState:
  """Variables by mtf name, plus the counter random ops draw their step from."""

  def __init__(self):
    self.variables = {}
    self.random_steps = None

  def random_counter(self):
    """The counter variable, created once, eagerly, on first use."""
    if self.random_steps is None:
      with tf.init_scope():
        self.random_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                        name="random_steps")
    return self.random_steps

  def next_random_step(self):
    """Advances the counter and returns its new value."""
    return tf.convert_to_tensor(self.random_counter().assign_add(1))

  def last_random_step(self):
    """The counter's value (the step of the latest draw), without advancing it."""
    return tf.convert_to_tensor(self.random_counter().read_value())

  def advance_random_steps(self, n):
    """Advances the counter by the int64 tensor n (draws numbered outside it)."""
    return self.random_counter().assign_add(n)


def _outermost_tracing_function():
  """The outermost tf.function object whose call is on the Python stack, or None."""
  found = None
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    owner = frame.f_locals.get("self")
    if (type(owner).__name__ == "Function" and hasattr(owner, "python_function") and
        hasattr(owner, "get_concrete_function")):
      found = owner
    frame = frame.f_back
  return found


def current_trace_owner():
  """What identifies the trace in progress: the outermost tf.function object being
  traced (or, lacking one, the outermost FuncGraph's name); None when eager."""
  if not tf.inside_function():
    return None
  function = _outermost_tracing_function()
  if function is not None:
    return function
  graph = tf.compat.v1.get_default_graph()
  # A FuncGraph has an outer_graph; the outermost one's outer graph is a plain tf.Graph.
  while hasattr(getattr(graph, "outer_graph", None), "outer_graph"):
    graph = graph.outer_graph
  return getattr(graph, "name", "tf.function")


def shared_state(owner, backend_key):
  """The MeshState every MeshImpl with this backend key built in owner's traces shares."""
  states = (_TRACED_STATES if isinstance(owner, str) else _STATES_BY_FUNCTION).setdefault(
      owner, {})
  if backend_key not in states:
    states[backend_key] = MeshState()
  return states[backend_key]
