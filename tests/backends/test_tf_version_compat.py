"""TF internals that some admitted TensorFlow releases lack degrade to the public path
with one warning, never an AttributeError."""
import warnings

import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends import gspmd_sharding


def test_gspmd_without_sharded_resource_variables_warns_once(monkeypatch):
  # TF 2.16 has no context.xla_sharding_for_resource_variables_enabled.
  monkeypatch.delattr(gspmd_sharding.context, "xla_sharding_for_resource_variables_enabled")
  monkeypatch.setattr(gspmd_sharding, "_warned_no_variable_sharding", [])
  proto = mtf.GSPMDMeshImpl("rows:2;cols:4", "").sharding_of(mtf.Shape([]))
  variable = tf.Variable(1.0)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert gspmd_sharding.annotate_variable(variable, proto) == 0
    assert gspmd_sharding.annotate_variable(variable, proto) == 0
  assert [str(w.message) for w in caught if w.category is RuntimeWarning] == [
      "TensorFlow %s has no sharded resource variables "
      "(context.xla_sharding_for_resource_variables_enabled); GSPMD annotates variable "
      "reads only" % tf.__version__]
  assert variable._get_xla_sharding() is None  # pylint: disable=protected-access
