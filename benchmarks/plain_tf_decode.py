"""Cached greedy decoding of the README LM written by hand in plain TensorFlow, on one
device: the reference that decode_speed times next to mesh_tf's decoding.

The same computation as mesh_tf's Unitransformer LM (gin_configs/models/lm_cpu_small.gin:
token plus positional embedding, per layer rms-normed self-attention and a ReLU
feed-forward layer with residuals, a final rms norm, logits from the shared embedding
scaled by d_model ** -0.5, the padded vocab masked) on the weights of a mesh_tf
checkpoint, so its greedy ids are comparable with mesh_tf's. The prompt is run once
over its positions; then a tf.while_loop decodes one position per step, writing each
layer's key and value into [batch, heads, length, d_kv] caches in place
(tf.raw_ops.InplaceUpdate, as mesh_tf's loop does).

attend="static" attends over the caches' whole length with the positions after the
step masked, as mesh_tf (and the original) do; attend="prefix" attends over the
positions up to the step only (a dynamic slice of the caches each step), which is what
decoding costs when the work per step grows with the filled prefix alone.
"""
import numpy as np
import tensorflow as tf

_NEG = -1e9  # a masked logit


def load_weights(checkpoint, num_layers):
  """{name: float32 np.ndarray} of a mesh_tf Unitransformer LM checkpoint (scope "transformer")."""
  reader = tf.train.load_checkpoint(checkpoint)

  def get(name):  # float32, as mesh_tf's slices are (the checkpoint's are bfloat16)
    return np.asarray(reader.get_tensor(name), np.float32)
  w = {"embedding": get("transformer/embedding"),
       "positional_embedding": get("transformer/positional_embedding"),
       "final_scale": get("transformer/rms_norm/scale"), "layers": []}
  for i in range(num_layers):
    block = "transformer/block_%03d/" % i
    attn, ffn = block + "layer_000/", block + "layer_001/"
    w["layers"].append({
        "attn_scale": get(attn + "rms_norm/scale"),
        "q": get(attn + "SelfAttention/q"),
        "k": get(attn + "SelfAttention/k"),
        "v": get(attn + "SelfAttention/v"),
        "o": get(attn + "SelfAttention/o"),
        "ffn_scale": get(ffn + "rms_norm/scale"),
        "wi": get(ffn + "DenseReluDense/wi/kernel"),
        "wo": get(ffn + "DenseReluDense/wo/kernel")})
  return w


def _rms_norm(x, scale):
  return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-6) * scale


def make_greedy_decode(weights, prompts, prompt_length, num_heads, vocab_size,
                       attend="static"):
  """A zero-argument tf.function: int32 [batch, length] ids, prompts (int32 [batch,
  length], prompt_length ids then zeros) continued greedily to the end."""
  if attend not in ("static", "prefix"):
    raise ValueError("attend must be 'static' or 'prefix', not %r" % (attend,))
  prompts = np.asarray(prompts, np.int32)
  batch, length = prompts.shape
  emb = tf.constant(weights["embedding"])
  pos_emb = tf.constant(weights["positional_embedding"][:length])
  final_scale = tf.constant(weights["final_scale"])
  layers = [{k: tf.constant(v) for k, v in layer.items()} for layer in weights["layers"]]
  padded_vocab, d_model = weights["embedding"].shape
  d_kv = weights["layers"][0]["q"].shape[1] // num_heads
  vocab_mask = tf.constant(np.where(np.arange(padded_vocab) >= vocab_size, _NEG, 0.0),
                           tf.float32)
  rows = np.arange(batch * num_heads, dtype=np.int32) * length

  def heads(x):  # [rows, heads * d_kv] -> [rows, heads, d_kv]
    return tf.reshape(x, [-1, num_heads, d_kv])

  def logits_of(x):
    x = _rms_norm(x, final_scale) * d_model ** -0.5
    return tf.matmul(x, emb, transpose_b=True) + vocab_mask

  def prefill(inputs):
    """Caches [batch, heads, length, d_kv] of the prompt's positions (zeros after)."""
    x = tf.gather(emb, inputs[:, :prompt_length]) + pos_emb[:prompt_length]
    causal = tf.constant(np.triu(np.full([prompt_length] * 2, _NEG, np.float32), 1))
    caches = []
    for layer in layers:
      h = _rms_norm(x, layer["attn_scale"])
      q, k, v = (tf.transpose(tf.reshape(tf.einsum("bld,dk->blk", h, layer[n]),
                                         [batch, prompt_length, num_heads, d_kv]),
                              [0, 2, 1, 3]) for n in ("q", "k", "v"))
      probs = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) + causal)
      o = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]),
                     [batch, prompt_length, num_heads * d_kv])
      x += tf.einsum("blk,kd->bld", o, layer["o"])
      h = _rms_norm(x, layer["ffn_scale"])
      x += tf.einsum("blf,fd->bld", tf.nn.relu(tf.einsum("bld,df->blf", h, layer["wi"])),
                     layer["wo"])
      pad = [[0, 0], [0, 0], [0, length - prompt_length], [0, 0]]
      caches += [tf.pad(k, pad), tf.pad(v, pad)]
    return caches

  def write(cache, new, step):  # new [batch, heads, d_kv] at position step, in place
    flat = tf.reshape(cache, [batch * num_heads * length, d_kv])
    flat = tf.raw_ops.InplaceUpdate(x=flat, i=rows + step,
                                    v=tf.reshape(new, [batch * num_heads, d_kv]))
    return tf.reshape(flat, [batch, num_heads, length, d_kv])

  def step_fn(step, ids, caches):  # ids: [length, batch], so a position is one row
    token = tf.gather(ids, step - 1)
    x = tf.gather(emb, token) + tf.gather(pos_emb, step)
    new_caches = []
    if attend == "static":
      bias = tf.where(tf.range(length) > step, _NEG, 0.0)
    for i, layer in enumerate(layers):
      h = _rms_norm(x, layer["attn_scale"])
      q, k, v = (heads(tf.matmul(h, layer[n])) for n in ("q", "k", "v"))
      k_cache, v_cache = write(caches[2 * i], k, step), write(caches[2 * i + 1], v, step)
      new_caches += [k_cache, v_cache]
      if attend == "prefix":
        k_cache, v_cache = k_cache[:, :, :step + 1], v_cache[:, :, :step + 1]
      logits = tf.squeeze(tf.matmul(q[:, :, None], k_cache, transpose_b=True), 2)
      if attend == "static":
        logits += bias
      o = tf.squeeze(tf.matmul(tf.nn.softmax(logits)[:, :, None], v_cache), 2)
      x += tf.matmul(tf.reshape(o, [batch, num_heads * d_kv]), layer["o"])
      h = _rms_norm(x, layer["ffn_scale"])
      x += tf.matmul(tf.nn.relu(tf.matmul(h, layer["wi"])), layer["wo"])
    next_ids = tf.argmax(logits_of(x), -1, output_type=tf.int32)
    ids = tf.raw_ops.InplaceUpdate(x=ids, i=[step], v=next_ids[None])
    return step + 1, ids, new_caches

  prompts_t = tf.constant(prompts)

  @tf.function
  def decode():
    inputs = tf.pad(prompts_t[:, :-1], [[0, 0], [1, 0]])  # shifted right, 0 first
    caches = [tf.raw_ops.DeepCopy(x=c) for c in prefill(inputs)]
    ids = tf.raw_ops.DeepCopy(x=tf.transpose(prompts_t))
    _, ids, _ = tf.while_loop(lambda s, *_: s < length, step_fn,
                              [tf.constant(prompt_length), ids, caches])
    return tf.transpose(ids)
  return decode
