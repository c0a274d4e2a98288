"""The TF state of a mesh -- its laid-out variables and its random-op step counter.

Usually a MeshImpl owns its state. The original's pattern of building the graph, the
MeshImpl and the Lowering inside the model function breaks that under `tf.function`:
each trace (TF traces a function twice on its first call when it creates variables)
makes a new MeshImpl, and new variables on a later trace are an error. So a MeshImpl
constructed *while a tf.function traces* shares its state with every other MeshImpl
built in a trace of a function of the same name, with the same backend, mesh shape,
layout and devices: the variables are created once, on the first trace, and every later
trace reuses them. MeshImpls built eagerly keep state of their own, as before.
"""
import tensorflow as tf

# (function name, backend key) -> MeshState, for MeshImpls constructed inside traces.
_TRACED_STATES = {}


class MeshState:
  """Variables by mtf name, plus the counter random ops draw their step from."""

  def __init__(self):
    self.variables = {}
    self.random_steps = None

  def next_random_step(self):
    """Advances the counter (created once, eagerly) and returns its new value."""
    if self.random_steps is None:
      with tf.init_scope():
        self.random_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                        name="random_steps")
    return tf.convert_to_tensor(self.random_steps.assign_add(1))


def current_trace_name():
  """The name of the outermost tf.function being traced, or None when eager."""
  if not tf.inside_function():
    return None
  graph = tf.compat.v1.get_default_graph()
  # A FuncGraph has an outer_graph; the outermost one's outer graph is a plain tf.Graph.
  while hasattr(getattr(graph, "outer_graph", None), "outer_graph"):
    graph = graph.outer_graph
  return getattr(graph, "name", "tf.function")


def shared_state(trace_name, backend_key):
  """The MeshState every MeshImpl with this key built in traces of trace_name shares."""
  key = (trace_name, backend_key)
  if key not in _TRACED_STATES:
    _TRACED_STATES[key] = MeshState()
  return _TRACED_STATES[key]


def forget_traced_states():
  """Drops the shared states (their variables stay alive where something holds them)."""
  _TRACED_STATES.clear()
