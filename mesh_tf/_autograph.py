"""Keeps AutoGraph from converting mesh_tf's own code inside tf.function.

mesh_tf builds graphs and emits TF ops from plain Python, so AutoGraph's rewriting buys
nothing and costs seconds per trace. The public entry points are also wrapped in
`tf.autograph.experimental.do_not_convert`; this module-level rule additionally covers
graph-building code (layers, models) that a user calls inside a tf.function.
"""
try:
  from tensorflow.python.autograph.core import config as _config  # pylint: disable=g-direct-tensorflow-import

  _RULE = _config.DoNotConvert("mesh_tf")
  if _RULE not in _config.CONVERSION_RULES:
    _config.CONVERSION_RULES = (_RULE, _config.DoNotConvert("models")) + tuple(
        _config.CONVERSION_RULES)
except (ImportError, AttributeError):  # private API moved: the decorators still apply
  pass
