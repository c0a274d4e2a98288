"""The original's `mesh_tensorflow.test_utils`: converting between numpy and mtf.

`NumpyConverter` owns a Graph and a single-processor mesh; it imports numpy arrays as
mtf Tensors and evaluates mtf Tensors back to numpy (eagerly, through a Lowering on a
one-device PlacementMeshImpl).
"""
import numpy as np
import tensorflow as tf

from mesh_tf.backends.placement import PlacementMeshImpl
from mesh_tf.graph import Graph, Mesh
from mesh_tf.lowering import Lowering
from mesh_tf.ops.creation import import_tf_tensor
from mesh_tf.shapes import Dimension, Shape


class EagerSession:
  """What `NumpyConverter.session` returns in TF 2: `run(fetches)` gives numpy values."""

  def run(self, fetches):
    """Evaluates a TF value, or a (nested) list/tuple/dict of them, to numpy."""
    return tf.nest.map_structure(
        lambda t: t.numpy() if hasattr(t, "numpy") else np.asarray(t), fetches)


class NumpyConverter:
  """Converts numpy arrays to mtf Tensors on its own mesh, and mtf Tensors back."""

  def __init__(self):
    self._graph = Graph()
    self._mesh = Mesh(self._graph, "mtf_mesh")
    self._mesh_impl = PlacementMeshImpl(shape=[], layout={}, devices=[""])
    self._session = EagerSession()

  @property
  def graph(self):
    return self._graph

  @property
  def mesh(self):
    return self._mesh

  @property
  def session(self):
    return self._session

  def convert_np_array_to_mtf_tensor(self, x, dim_names=None, dtype=tf.int32):
    """Imports numpy array x; dims are named dim_names (default "dim0", "dim1", ...)."""
    x = np.asarray(x)
    if not dim_names:  # None or empty (as the original)
      dim_names = ["dim%d" % i for i in range(x.ndim)]
    if len(dim_names) != x.ndim:
      raise ValueError("convert_np_array_to_mtf_tensor: %d dim names %s for an array of "
                       "rank %d" % (len(dim_names), list(dim_names), x.ndim))
    shape = Shape([Dimension(n, s) for n, s in zip(dim_names, x.shape)])
    return import_tf_tensor(self._mesh, tf.convert_to_tensor(x, dtype=dtype), shape)

  def convert_mtf_tensor_to_tf_tensor(self, mtf_tensor):
    """Lowers the graph; returns the pair (lowering, tf.Tensor of mtf_tensor's full value)."""
    lowering = Lowering(self._graph, {self._mesh: self._mesh_impl})
    return lowering, lowering.export_to_tf_tensor(mtf_tensor)

  def convert_mtf_tensor_to_np_array(self, x_mtf):
    """The value of mtf Tensor x_mtf as a numpy array (also under a tf.compat.v1
    Graph: then a Session on that graph initializes its variables and evaluates it,
    as the original did)."""
    _, x_tf = self.convert_mtf_tensor_to_tf_tensor(x_mtf)
    if tf.executing_eagerly():
      return self._session.run(x_tf)
    with tf.compat.v1.Session(graph=x_tf.graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run(x_tf)
