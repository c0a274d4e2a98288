"""Examples in the original library's style (model function building its own mesh,
MeshImpl and Lowering), with Estimator scaffolding replaced by a tf.function loop."""
import tensorflow as tf

import mesh_tf as mtf


def start_training(defaults, overrides, mesh_shape, layout, devices, seed):
  """The run's params (defaults, the mesh, then overrides); sets a fresh global step and
  TF's seed, so the initializers draw in the same order on any mesh."""
  params = dict(defaults, mesh_shape=mesh_shape, layout=layout, devices=devices)
  params.update(overrides)
  mtf.optimize.set_global_step(tf.Variable(0, dtype=tf.int64, trainable=False))
  tf.random.set_seed(seed)
  return params


def cpu_devices(mesh_shape):
  """Names of one virtual CPU per processor of mesh_shape (made here), or [""]."""
  shape = mtf.convert_to_shape(mesh_shape)
  mtf.utils.configure_virtual_cpus(max(shape.size, 1))
  return ["/cpu:%d" % i for i in range(shape.size)] or [""]
