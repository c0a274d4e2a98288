"""Sizes of the tiny LM."""
import collections

TinyLmConfig = collections.namedtuple("TinyLmConfig", [
    "batch", "length", "vocab", "d_model", "heads", "d_kv", "d_ff", "num_layers",
    "learning_rate"])
TinyLmConfig.__new__.__defaults__ = (16, 32, 64, 32, 4, 8, 64, 2, 0.05)
TinyLmConfig.__doc__ = "Batch, sequence, vocabulary and layer sizes; SGD learning rate."


def weight_shapes(c):
  """{variable name: list of (dim name, size)} in creation order (shared by both models)."""
  shapes = {"embedding": [("vocab", c.vocab), ("d_model", c.d_model)]}
  for i in range(c.num_layers):
    p = "layer_%d/" % i
    shapes[p + "attn_scale"] = [("d_model", c.d_model)]
    for w in "qkv":
      shapes[p + w] = [("d_model", c.d_model), ("heads", c.heads), ("d_kv", c.d_kv)]
    shapes[p + "o"] = [("heads", c.heads), ("d_kv", c.d_kv), ("d_model", c.d_model)]
    shapes[p + "ffn_scale"] = [("d_model", c.d_model)]
    shapes[p + "wi"] = [("d_model", c.d_model), ("d_ff", c.d_ff)]
    shapes[p + "wo"] = [("d_ff", c.d_ff), ("d_model", c.d_model)]
  shapes["final_scale"] = [("d_model", c.d_model)]
  shapes["softmax"] = [("d_model", c.d_model), ("vocab", c.vocab)]
  return shapes


def initial_weights(c, seed=0):
  """Deterministic initial values (numpy float32) for weight_shapes(c)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  out = {}
  for name, dims in weight_shapes(c).items():
    sizes = [s for _, s in dims]
    if name.endswith("scale"):
      out[name] = np.ones(sizes, np.float32)
    else:
      fan_in = sizes[0] if name != "o" and not name.endswith("/o") else sizes[0] * sizes[1]
      out[name] = (rng.randn(*sizes) / np.sqrt(fan_in)).astype(np.float32)
  return out


def synthetic_batch(c, seed=0):
  """Token ids [batch, length+1] of a learnable pattern (each row counts up mod vocab)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  start = rng.randint(0, c.vocab, size=[c.batch, 1])
  step = rng.randint(1, 4, size=[c.batch, 1])
  return ((start + step * np.arange(c.length + 1)[None, :]) % c.vocab).astype(np.int32)
