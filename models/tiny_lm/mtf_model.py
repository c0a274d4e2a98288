"""The tiny LM as an mtf graph: pre-norm attention + ReLU FFN layers, SGD training."""
import tensorflow as tf

import mesh_tf as mtf
from models import train_steps
from models.transformer import attention
from models.tiny_lm import config as config_lib


def _rms_norm(x, scale, dim):
  ms = mtf.reduce_mean(mtf.square(x), reduced_dim=dim)
  return x * mtf.rsqrt(ms + 1e-6) * scale


class TinyLmModel:
  """Graph, placeholders (`inputs`, `targets`: [batch, length] int32) and train ops."""

  def __init__(self, c=None, weights=None):
    c = c or config_lib.TinyLmConfig()
    self.config = c
    self.graph = mtf.Graph()
    self.mesh = mtf.Mesh(self.graph, "mesh")
    dim = mtf.Dimension
    batch, length = dim("batch", c.batch), dim("length", c.length)
    memory = dim("memory_length", c.length)
    d_model, vocab = dim("d_model", c.d_model), dim("vocab", c.vocab)
    weights = weights or config_lib.initial_weights(c)
    self.variables = {}
    for name, dims in config_lib.weight_shapes(c).items():
      self.variables[name] = mtf.get_variable(
          self.mesh, name, [dim(n, s) for n, s in dims],
          initializer=lambda shape, dtype, v=weights[name], **_: tf.constant(v, dtype))
    v = self.variables
    spec = tf.TensorSpec([c.batch, c.length], tf.int32)
    self.inputs = mtf.import_tf_tensor(self.mesh, spec, [batch, length], name="inputs")
    self.targets = mtf.import_tf_tensor(self.mesh, spec, [batch, length], name="targets")
    x = mtf.gather(v["embedding"], self.inputs, vocab)
    causal = mtf.cast(mtf.less(mtf.range(self.mesh, length, tf.int32),
                               mtf.range(self.mesh, memory, tf.int32)), tf.float32) * -1e9
    for i in range(c.num_layers):
      p = "layer_%d/" % i
      h = _rms_norm(x, v[p + "attn_scale"], d_model)
      q = mtf.einsum([h, v[p + "q"]], reduced_dims=[d_model])
      k = mtf.rename_dimension(mtf.einsum([h, v[p + "k"]], reduced_dims=[d_model]),
                               "length", "memory_length")
      val = mtf.rename_dimension(mtf.einsum([h, v[p + "v"]], reduced_dims=[d_model]),
                                 "length", "memory_length")
      d_kv = q.shape.get_dim_by_name("d_kv")
      attn = attention.attention(q, k, val, memory, d_kv, d_kv, bias=causal)
      x += mtf.einsum([attn, v[p + "o"]], output_shape=x.shape)
      h = _rms_norm(x, v[p + "ffn_scale"], d_model)
      x += mtf.einsum([mtf.relu(mtf.einsum([h, v[p + "wi"]], reduced_dims=[d_model])),
                       v[p + "wo"]], output_shape=x.shape)
    x = _rms_norm(x, v["final_scale"], d_model)
    self.logits = mtf.einsum([x, v["softmax"]], reduced_dims=[d_model])
    xent = mtf.layers.softmax_cross_entropy_with_logits(
        self.logits, mtf.one_hot(self.targets, vocab), vocab)
    self.loss = mtf.reduce_mean(xent)
    grads = mtf.gradients([self.loss], list(v.values()))
    self.update_ops = [mtf.assign(w, w - g * c.learning_rate) for w, g in zip(v.values(), grads)]

  def lowering(self, mesh_impl, inputs=None, targets=None):
    """A Lowering on mesh_impl, fed with one batch if given."""
    feeds = {} if inputs is None else {self.inputs: inputs, self.targets: targets}
    return mtf.Lowering(self.graph, {self.mesh: mesh_impl}, feeds=feeds)

  def make_train_step(self, mesh_impl, jit_compile=False):
    """tf.function(inputs, targets) -> loss before the SGD update."""
    return train_steps.make_train_step(self, mesh_impl, jit_compile)
