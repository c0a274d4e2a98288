"""The Transformer feed-forward block."""
import tensorflow as tf

from mesh_tf.layers.dense import dense
from mesh_tf.layers.scoping import layer_scope
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import random as random_ops


def dense_relu_dense(x, hidden_channels, is_training, dropout=0.0,
                     dropout_broadcast_dims=None, master_dtype=tf.float32,
                     slice_dtype=tf.float32, name=None):
  """relu(x . wi) . wo, with optional dropout on the hidden activations.

  Kernels "wi/kernel" [io, hidden_channels] and "wo/kernel" [hidden_channels, io]
  (no biases) live in scope `name` (default a fresh "dense_relu_dense"); io is the last
  dim of x. Returns x's shape.
  """
  io_channels = x.shape.dims[-1]
  with layer_scope(x.graph, name, "dense_relu_dense"):
    h = dense(x, hidden_channels, use_bias=False, activation=ew.relu,
              master_dtype=master_dtype, slice_dtype=slice_dtype, name="wi")
    if is_training and dropout != 0.0:
      h = random_ops.dropout(h, rate=dropout,
                             noise_shape=h.shape - list(dropout_broadcast_dims or []))
    return dense(h, io_channels, use_bias=False, master_dtype=master_dtype,
                 slice_dtype=slice_dtype, name="wo")
