"""The default Transformer LM written directly in plain TF 2 (no mesh_tf), for benchmarks.

`TfTransformerLm` computes what models.transformer's Unitransformer computes with the
default gin configuration (gin_configs/defaults.gin: pre-norm layers of SelfAttention
and DenseReluDense, rms_norm, tied softmax weights with the hidden state scaled by
d_model**-0.5, z_loss in training, loss summed over non-padding targets and divided by
batch * length), on unpacked [batch, length] targets. Its variables are keyed by the
mtf names ("transformer/embedding", "transformer/block_000/layer_000/SelfAttention/q",
...), so it can start from the values of an mtf model or of a checkpoint.

`AdafactorUpdater` and `SgdUpdater` are the update rules of mtf.optimize's
AdafactorOptimizer and SgdOptimizer (constant rates), for plain tf.Variables.
"""
import numpy as np
import tensorflow as tf

# Only the error classes: the model itself is plain TF.
from mesh_tf.errors import CheckpointError, MtfError, ShapeError

NEG_INF = -1e9
RMS_NORM_EPSILON = 1e-6


def _rms_norm(x, scale):
  return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True)
                           + RMS_NORM_EPSILON) * scale


def _block_prefix(scope, block):
  return "%s/block_%03d/" % (scope, block)


def count_blocks(names, scope="transformer"):
  """How many "<scope>/block_NNN/" prefixes the variable names have."""
  blocks = 0
  while any(n.startswith(_block_prefix(scope, blocks)) for n in names):
    blocks += 1
  return blocks


class TfTransformerLm:
  """A decoder-only Transformer LM over tf.Variables named as the mtf model's.

  Args:
    weights: {mtf variable name: array} of the model's trainable variables (e.g.
      read from an mtf Lowering, or from a checkpoint with tf.train.load_checkpoint).
    num_heads: attention heads (the q/k/v/o variables hold heads * d_kv columns,
      the heads the major index, as the mtf model stores them).
    z_loss: coefficient of z_loss * logsumexp(logits)**2, added in training.
    scope: the model's variable scope ("transformer").
  """

  def __init__(self, weights, num_heads, z_loss=1e-4, scope="transformer"):
    self.scope = scope
    self.num_heads = num_heads
    self.z_loss = z_loss
    self.variables = {name: tf.Variable(np.asarray(value, np.float32),
                                        name=name.replace("/", "_"))
                      for name, value in sorted(weights.items())}
    self.num_blocks = count_blocks(self.variables, scope)
    missing = [n for n in self.required_names() if n not in self.variables]
    if missing:
      raise MtfError("TfTransformerLm: the weights lack %s (they have %s)" % (
          ", ".join(missing), ", ".join(sorted(self.variables)) or "nothing"),
                     tensor=missing[0])
    for block in range(self.num_blocks):
      name = _block_prefix(scope, block) + "layer_000/SelfAttention/q"
      if self.variables[name].shape[-1] % num_heads:
        raise ShapeError("TfTransformerLm: %s has %d columns, which num_heads=%d does "
                         "not divide" % (name, self.variables[name].shape[-1], num_heads),
                         tensor=name, dim="heads")

  @classmethod
  def from_checkpoint(cls, path, num_heads, z_loss=1e-4, scope="transformer"):
    """The model with the weights stored under their mtf names in a checkpoint (one
    written by mesh_tf or by the original library); optimizer slots are ignored."""
    try:
      reader = tf.train.load_checkpoint(path)
    except (tf.errors.NotFoundError, ValueError) as e:
      raise CheckpointError("TfTransformerLm: cannot read checkpoint %s: %s" % (path, e),
                            file=path) from e
    weights = {name: np.asarray(reader.get_tensor(name), np.float32)
               for name in reader.get_variable_to_shape_map()
               if name.startswith(scope + "/") and "_slot_" not in name}
    if not weights:
      raise CheckpointError("TfTransformerLm: checkpoint %s has no variables under %r"
                            % (path, scope + "/"), file=path)
    return cls(weights, num_heads, z_loss=z_loss, scope=scope)

  def required_names(self):
    """The variable names this model reads."""
    names = [self.scope + "/embedding", self.scope + "/positional_embedding",
             self.scope + "/rms_norm/scale"]
    for block in range(self.num_blocks):
      p = _block_prefix(self.scope, block)
      names += [p + "layer_000/rms_norm/scale", p + "layer_001/rms_norm/scale"]
      names += [p + "layer_000/SelfAttention/" + w for w in "qkvo"]
      names += [p + "layer_001/DenseReluDense/wi/kernel",
                p + "layer_001/DenseReluDense/wo/kernel"]
    return names

  def _attention(self, x, prefix, causal_bias):
    v = self.variables
    batch, length = tf.shape(x)[0], tf.shape(x)[1]
    heads = self.num_heads
    d_kv = v[prefix + "q"].shape[-1] // heads
    split = lambda t: tf.reshape(t, [batch, length, heads, d_kv])
    q, k, val = (split(tf.einsum("bld,dn->bln", x, v[prefix + w])) for w in "qkv")
    logits = tf.einsum("blhk,bmhk->bhlm", q, k) + causal_bias
    out = tf.einsum("bhlm,bmhk->blhk", tf.nn.softmax(logits, -1), val)
    return tf.einsum("bln,nd->bld", tf.reshape(out, [batch, length, heads * d_kv]),
                     v[prefix + "o"])

  def logits_and_loss(self, targets, train=True):
    """(logits [batch, length, padded vocab], scalar loss) for int32 targets.

    The inputs are the targets shifted right by one with 0 in front; targets equal to
    0 (padding) carry no loss. z_loss is added only when train is True.
    """
    v, s = self.variables, self.scope
    targets = tf.convert_to_tensor(targets, tf.int32)
    length = targets.shape[1]
    inputs = tf.pad(targets[:, :-1], [[0, 0], [1, 0]])
    x = tf.gather(v[s + "/embedding"], inputs) + v[s + "/positional_embedding"][:length]
    positions = tf.range(length)
    causal_bias = tf.where(positions[None, :] > positions[:, None], NEG_INF, 0.0)
    for block in range(self.num_blocks):
      p = _block_prefix(s, block)
      h = _rms_norm(x, v[p + "layer_000/rms_norm/scale"])
      x += self._attention(h, p + "layer_000/SelfAttention/", causal_bias)
      h = _rms_norm(x, v[p + "layer_001/rms_norm/scale"])
      f = p + "layer_001/DenseReluDense/"
      x += tf.einsum("blf,fd->bld",
                     tf.nn.relu(tf.einsum("bld,df->blf", h, v[f + "wi/kernel"])),
                     v[f + "wo/kernel"])
    x = _rms_norm(x, v[s + "/rms_norm/scale"])
    embedding = v[s + "/embedding"]
    logits = tf.einsum("bld,vd->blv", x * embedding.shape[-1] ** -0.5, embedding)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits)
    if train and self.z_loss:
      xent += self.z_loss * tf.square(tf.reduce_logsumexp(logits, -1))
    weights = tf.cast(tf.not_equal(targets, 0), xent.dtype)
    denominator = tf.cast(tf.size(targets), xent.dtype)
    return logits, tf.reduce_sum(xent * weights) / denominator

  def make_train_step(self, updater, jit_compile=False):
    """tf.function(targets) -> the loss before one update of every variable."""
    names = sorted(self.variables)
    variables = [self.variables[n] for n in names]
    updater.create_slots(self.variables)  # eagerly, before the trace

    @tf.function(jit_compile=jit_compile)
    def train_step(targets):
      with tf.GradientTape() as tape:
        _, loss = self.logits_and_loss(targets, train=True)
      grads = tape.gradient(loss, variables)
      for name, var, grad in zip(names, variables, grads):
        updater.apply(name, var, tf.convert_to_tensor(grad))
      return loss
    return train_step


class SgdUpdater:
  """var -= learning_rate * grad (no slots: `slots` stays empty)."""

  def __init__(self, learning_rate):
    self.learning_rate = learning_rate
    self.slots = {}

  def create_slots(self, variables):
    """SGD keeps no slots."""
    del variables

  def apply(self, name, var, grad):
    """Updates var in place."""
    del name
    var.assign_sub(grad * self.learning_rate)


def factored_axes(shape, min_dim_size_to_factor=128):
  """(axis of the largest dim, axis of the second largest), ties to the earlier axis,
  or None when the variable has under 2 dims or the second is under the minimum."""
  if len(shape) < 2:
    return None
  by_size = sorted(range(len(shape)), key=lambda a: -shape[a])
  if shape[by_size[1]] < min_dim_size_to_factor:
    return None
  return by_size[0], by_size[1]


def _rms(x):
  return tf.sqrt(tf.reduce_mean(tf.square(x)))


class AdafactorUpdater:
  """Adafactor with constant rates and no momentum, as mtf's AdafactorOptimizer.

  Slots are tf.Variables in `slots`, keyed like the mtf slots ("<name>_slot_vr",
  "<name>_slot_vc" or "<name>_slot_v"); the factored ones keep the reduced axis with
  extent 1. They are created on the first `apply` of each variable.
  """

  def __init__(self, learning_rate, decay_rate, clipping_threshold=1.0, epsilon1=1e-30,
               epsilon2=1e-3, min_dim_size_to_factor=128):
    self.learning_rate = learning_rate
    self.decay_rate = decay_rate
    self.clipping_threshold = clipping_threshold
    self.epsilon1 = epsilon1
    self.epsilon2 = epsilon2
    self.min_dim_size_to_factor = min_dim_size_to_factor
    self.slots = {}

  def create_slots(self, variables):
    """Creates the zero slots of {name: tf.Variable} (call eagerly, before tracing)."""
    for name, var in variables.items():
      axes = factored_axes(var.shape, self.min_dim_size_to_factor)
      if axes is None:
        self._slot(name + "_slot_v", var.shape)
      else:
        for suffix, axis in (("_slot_vr", axes[0]), ("_slot_vc", axes[1])):
          shape = list(var.shape)
          shape[axis] = 1
          self._slot(name + suffix, shape)

  def _slot(self, key, shape):
    if key not in self.slots:
      self.slots[key] = tf.Variable(tf.zeros(shape), trainable=False,
                                    name=key.replace("/", "_"))
    return self.slots[key]

  def apply(self, name, var, grad):
    """Updates var and its slots in place."""
    decay, mixing = self.decay_rate, 1.0 - self.decay_rate
    grad_squared = tf.square(grad) + self.epsilon1
    axes = factored_axes(var.shape, self.min_dim_size_to_factor)
    if axes is None:
      v = self.slots[name + "_slot_v"]
      new_v = v * decay + grad_squared * mixing
      v.assign(new_v)
      x = grad * tf.math.rsqrt(new_v)
    else:
      row_axis, col_axis = axes
      vr, vc = self.slots[name + "_slot_vr"], self.slots[name + "_slot_vc"]
      new_vr = vr * decay + tf.reduce_mean(grad_squared, row_axis, keepdims=True) * mixing
      new_vc = vc * decay + tf.reduce_mean(grad_squared, col_axis, keepdims=True) * mixing
      vr.assign(new_vr)
      vc.assign(new_vc)
      row_mean = tf.reduce_mean(new_vr, col_axis, keepdims=True)
      x = grad * tf.math.rsqrt(new_vr / row_mean) * tf.math.rsqrt(new_vc)
    if self.clipping_threshold is not None:
      x /= tf.maximum(_rms(x) / self.clipping_threshold, 1.0)
    scale = tf.maximum(_rms(var), self.epsilon2)
    var.assign_sub(x * (scale * self.learning_rate))
