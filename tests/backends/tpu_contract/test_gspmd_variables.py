"""GSPMD variable annotation under a distribution strategy and on foreign objects."""
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

import mesh_tf as mtf
from mesh_tf.backends import gspmd_sharding


@pytest.fixture
def sharded_resource_variables():
  """Turns TF's XLA sharding for resource variables on for one test."""
  context.enable_xla_sharding_for_resource_variables()
  yield
  context.disable_xla_sharding_for_resource_variables()


def test_every_component_of_a_distributed_variable_is_annotated(
    strategy, sharded_resource_variables):
  del sharded_resource_variables
  impl = mtf.GSPMDMeshImpl("rows:2;cols:4", "hidden:cols")
  proto = impl.sharding_of(mtf.Shape([mtf.Dimension("hidden", 8)]))
  with strategy.scope():
    variable = tf.Variable(tf.zeros([8]))
  assert gspmd_sharding.annotate_variable(variable, proto) == 8
  for component in strategy.experimental_local_results(variable):
    assert component._get_xla_sharding() is proto  # pylint: disable=protected-access


def test_objects_without_the_hook_are_left_alone(sharded_resource_variables):
  del sharded_resource_variables

  class NotAResourceVariable:
    pass
  proto = mtf.GSPMDMeshImpl("rows:2;cols:4", "").sharding_of(mtf.Shape([]))
  assert gspmd_sharding.annotate_variable(NotAResourceVariable(), proto) == 0
  plain = tf.Variable(1.0)
  assert gspmd_sharding.annotate_variable(plain, proto) == 1


def test_nothing_is_annotated_while_tf_does_not_support_it():
  proto = mtf.GSPMDMeshImpl("rows:2;cols:4", "").sharding_of(mtf.Shape([]))
  variable = tf.Variable(1.0)
  assert gspmd_sharding.annotate_variable(variable, proto) == 0
  assert variable._get_xla_sharding() is None  # pylint: disable=protected-access
