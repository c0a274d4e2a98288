"""Keeps AutoGraph from converting mesh_tf's own code inside tf.function.

AutoGraph's rewriting of plain graph-building Python buys nothing and costs seconds per
trace; this rule also covers the layers and models a user calls inside a tf.function.
"""
try:
  from tensorflow.python.autograph.core import config as _config  # pylint: disable=g-direct-tensorflow-import

  _RULE = _config.DoNotConvert("mesh_tf")
  if _RULE not in _config.CONVERSION_RULES:
    _config.CONVERSION_RULES = (_RULE, _config.DoNotConvert("models")) + tuple(
        _config.CONVERSION_RULES)
except (ImportError, AttributeError):  # private API moved: the decorators still apply
  pass
