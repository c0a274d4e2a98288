"""The speed layer's one switch, and the probe of the TF internals it needs.

The speed layer makes lowering fast through TensorFlow's private internals (`direct_ops`,
`slice_replay`, `slice_segments`, `simd_vectorize`, `simd_matmul`). Each asks `active()`
before using an internal; where it answers None they take the plain path (public TF API
only: the same values, slower to build).

The switch, from the strongest setting to the weakest:
  1. `set_enabled(True/False)` or the `switched(on)` context manager (tests);
  2. the environment variable MESH_TF_SPEED_LAYER=1/0;
  3. the gin binding `speed_layer.enabled = False` (read when a Lowering is made);
  4. on.

Switched on, the internals are probed once; where one is missing the layer stays off
with one warning (`SpeedLayerFallbackWarning`) instead of failing.
"""
import contextlib
import importlib
import os
import types
import warnings

import gin
import tensorflow as tf

ENV_VAR = "MESH_TF_SPEED_LAYER"
_OFF_VALUES = ("0", "false", "off", "no")

# {name the layer reads it under: (module, attributes used)} of TF's private internals.
_MODULES = {
    "pywrap_tf_session": ("tensorflow.python.client.pywrap_tf_session",
                          ("TF_GraphToFunction_wrapper", "TF_FunctionToFunctionDef",
                           "TF_GetBuffer", "TF_DeleteFunction")),
    "context": ("tensorflow.python.eager.context", ("context",)),
    "atomic_function": ("tensorflow.python.eager.polymorphic_function.atomic_function",
                        ("AtomicFunction",)),
    "concrete_function": ("tensorflow.python.eager.polymorphic_function.concrete_function",
                          ("ConcreteFunction",)),
    "c_api_util": ("tensorflow.python.framework.c_api_util", ("tf_buffer",)),
    "function_def_to_graph": ("tensorflow.python.framework.function_def_to_graph",
                              ("function_def_to_graph",)),
    "func_graph": ("tensorflow.python.framework.func_graph", ("FuncGraph",)),
    "resource_variable_ops": ("tensorflow.python.ops.resource_variable_ops",
                              ("ResourceVariable",)),
    "record": ("tensorflow.python.eager.record", ("could_possibly_record",)),
    "function_type": ("tensorflow.core.function.polymorphism.function_type",
                      ("from_structured_signature",)),
    "compat": ("tensorflow.python.util.compat", ("as_bytes", "as_str")),
}
# Private attributes used on a graph, an op, a symbolic tensor and AtomicFunction.
_GRAPH_ATTRS = ("_create_op_internal", "_c_graph", "_add_function_recursive",
                "_override_gradient_function", "_control_dependencies_stack")
_OP_ATTRS = ("_c_op", "_add_control_input")
_TENSOR_ATTRS = ("_as_tf_output", "_set_shape")
_ATOMIC_FUNCTION_ATTRS = ("_function_type", "definition", "name")
_CONTEXT_ATTRS = ("add_function_def", "function_call_options")


class SpeedLayerFallbackWarning(RuntimeWarning):
  """TF lacks an internal the speed layer needs: lowering takes the plain path."""


class MissingInternal(Exception):
  """Raised by the probe, naming what TF lacks."""


_override = None  # set_enabled / switched: True, False or None (not set)
_internals = None  # the probe's namespace once it passed
_probe_failure = None  # what the probe found missing (one warning, then kept off)
_active = None  # cached answer of active(): the namespace, False (off), None (unknown)


@gin.configurable("speed_layer")
def configured(enabled=None):
  """The gin setting: `speed_layer.enabled = False` turns the layer off; None (default)
  leaves it to the environment variable."""
  return enabled


def _from_environment():
  value = os.environ.get(ENV_VAR, "").strip().lower()
  return (value not in _OFF_VALUES) if value else None


def switch_setting():
  """Whether the switch says on (not whether the internals are there: see enabled())."""
  if _override is not None:
    return _override
  env = _from_environment()
  if env is not None:
    return env
  gin_value = configured()
  return True if gin_value is None else bool(gin_value)


def _require(obj, attrs, label):
  for attr in attrs:
    if not hasattr(obj, attr):
      raise MissingInternal("%s.%s" % (label, attr))


def _probe():
  """A namespace of the internals; raises MissingInternal naming one TF lacks."""
  found = {}
  for key, (module_name, attrs) in _MODULES.items():
    try:
      module = importlib.import_module(module_name)
    except ImportError:
      raise MissingInternal(module_name) from None
    _require(module, attrs, module_name)
    found[key] = module
  found["ResourceVariable"] = found["resource_variable_ops"].ResourceVariable
  found["could_possibly_record"] = found["record"].could_possibly_record
  found["FuncGraph"] = found["func_graph"].FuncGraph
  _require(found["atomic_function"].AtomicFunction, _ATOMIC_FUNCTION_ATTRS, "AtomicFunction")
  _require(found["context"].context(), _CONTEXT_ATTRS, "eager Context")
  # the attributes used on a graph's ops and tensors, looked up on real ones
  graph = tf.Graph()
  _require(graph, _GRAPH_ATTRS, "tf.Graph")
  with graph.as_default():
    tensor = tf.constant(0.0)
  _require(tensor.op, _OP_ATTRS, "tf.Operation")
  _require(tensor, _TENSOR_ATTRS, "graph tf.Tensor")
  return types.SimpleNamespace(**found)


def internals_available():
  """Whether the probe finds every internal (probed once; one warning if not)."""
  global _internals, _probe_failure
  if _internals is None and _probe_failure is None:
    try:
      _internals = _probe()
    except MissingInternal as e:
      _probe_failure = str(e)
    except Exception as e:  # pylint: disable=broad-except
      # an internal there but changed, e.g. a function's signature
      _probe_failure = "%s (%s: %s)" % ("a usable internal", type(e).__name__, e)
    if _probe_failure is not None:
      warnings.warn("mesh_tf: TensorFlow %s lacks %s; using the plain lowering path "
                    "(slower)" % (tf.__version__, _probe_failure),
                    SpeedLayerFallbackWarning, stacklevel=3)
  return _internals is not None


def internals():
  """The internals' namespace where TF has them (whatever the switch says), else None."""
  return _internals if internals_available() else None


def active():
  """The internals' namespace where the speed layer is on, else None. Cached: the
  layer's modules call it on every op they make."""
  if _active is None:
    return _resolve()
  return _active or None


def _resolve():
  global _active
  on = switch_setting() and internals_available()
  _active = _internals if on else False
  return _active or None


def enabled():
  """Whether the speed layer is on (the switch says on and TF has its internals)."""
  return active() is not None


def refresh():
  """Reads the switch again (environment, gin). Cheap; each Lowering calls it."""
  if _active is not None and switch_setting() != bool(_active):
    _resolve()


def reset():
  """Forgets the cached answer and the probe."""
  global _active, _internals, _probe_failure
  _active = _internals = _probe_failure = None


def set_enabled(on):
  """Turns the layer on or off (True/False) over the environment and gin; None hands
  the choice back to them."""
  global _override, _active
  _override = None if on is None else bool(on)
  _active = None


@contextlib.contextmanager
def switched(on):
  """Runs a block with the layer on or off, restoring the setting after."""
  global _override, _active
  saved = _override
  set_enabled(on)
  try:
    yield
  finally:
    _override = saved
    _active = None


def disabled():
  """Runs a block on the plain path: `with speed_layer.disabled(): ...`."""
  return switched(False)
