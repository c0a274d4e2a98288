"""The tiny LM written directly in plain TF 2 (tf.Variables, tf.einsum, GradientTape)."""
import tensorflow as tf

from models.tiny_lm import config as config_lib


def _rms_norm(x, scale):
  return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-6) * scale


class TfTinyLm:
  """Same sizes, initial weights, math and SGD update as models.tiny_lm.mtf_model."""

  def __init__(self, c=None, weights=None):
    self.config = c = c or config_lib.TinyLmConfig()
    weights = weights or config_lib.initial_weights(c)
    self.variables = {n: tf.Variable(w, name=n.replace("/", "_"))
                      for n, w in weights.items()}

  def loss(self, inputs, targets):
    """Mean next-token cross-entropy of a [batch, length] batch."""
    v, c = self.variables, self.config
    x = tf.gather(v["embedding"], inputs)
    causal = tf.cast(tf.range(c.length)[:, None] < tf.range(c.length)[None, :],
                     tf.float32) * -1e9
    for i in range(c.num_layers):
      p = "layer_%d/" % i
      h = _rms_norm(x, v[p + "attn_scale"])
      q = tf.einsum("bld,dhk->blhk", h, v[p + "q"])
      k = tf.einsum("bmd,dhk->bmhk", h, v[p + "k"])
      val = tf.einsum("bmd,dhk->bmhk", h, v[p + "v"])
      logits = tf.einsum("blhk,bmhk->bhlm", q, k) + causal
      attn = tf.einsum("bhlm,bmhk->blhk", tf.nn.softmax(logits, -1), val)
      x += tf.einsum("blhk,hkd->bld", attn, v[p + "o"])
      h = _rms_norm(x, v[p + "ffn_scale"])
      x += tf.einsum("blf,fd->bld", tf.nn.relu(tf.einsum("bld,df->blf", h, v[p + "wi"])),
                     v[p + "wo"])
    logits = tf.einsum("bld,dv->blv", _rms_norm(x, v["final_scale"]), v["softmax"])
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits))

  def make_train_step(self, jit_compile=False):
    """tf.function(inputs, targets) -> loss before the SGD update."""
    names = list(self.variables)

    @tf.function(jit_compile=jit_compile)
    def train_step(inputs, targets):
      with tf.GradientTape() as tape:
        loss = self.loss(inputs, targets)
      grads = tape.gradient(loss, [self.variables[n] for n in names])
      for n, g in zip(names, grads):
        self.variables[n].assign_sub(tf.convert_to_tensor(g) * self.config.learning_rate)
      return loss
    return train_step
