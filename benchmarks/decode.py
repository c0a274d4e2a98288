"""Cached (incremental) against recompute decoding: tokens/s of greedy decoding with
the `make train` Transformer LM (gin_configs/models/lm_cpu_small.gin and readme_lm.gin:
2 layers, d_model 64, batch 16, the byte vocabulary; fresh weights) for several numbers
of new tokens, both paths timed in alternating rounds in one run, on one device.

The recompute path runs the whole prefix through the model at every step (cost grows
with the square of the length); the cached path fills the key/value caches from the
prompt once and then runs one position per step. Both decode the same ids, which the
script checks (the recompute graph's weights are copied into the cached one).

  python -m benchmarks.decode [--new_tokens 16,64,256 --size small --repeats 3]
"""
import os
import tempfile

from absl import app
from absl import flags
import numpy as np

from benchmarks import common  # sets TF's log level before TF is imported
import tensorflow as tf  # pylint: disable=g-bad-import-order

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_list, "new_tokens", ["16", "64", "256"],
                   "Numbers of tokens to decode.")
common.define_flag(flags.DEFINE_integer, "prompt_length", 8,
                   "Prompt tokens per sequence.")
common.define_flag(flags.DEFINE_integer, "repeats", 3,
                   "Timed decodes per path and length (median).")
common.define_flag(flags.DEFINE_enum, "size", "small", list(common.TRANSFORMER_SIZES),
                   "small: the make train model (gin files as given); tiny: a smaller "
                   "model and batch for smoke tests.")

GIN_FILES = ["models/lm_cpu_small.gin", "readme_lm.gin"]
PATHS = ("recompute", "cached")


def _size_bindings(size, max_length):
  """gin bindings after GIN_FILES: a positional table long enough for the decode, and
  the sizes of common.TRANSFORMER_SIZES[size] unless it is the gin files' own."""
  bindings = ["Unitransformer.max_length = %d" % max_length]
  if size != "small":
    s = common.TRANSFORMER_SIZES[size]
    bindings += ["%s = %d" % (k, s[k])
                 for k in ("num_layers", "d_model", "d_ff", "num_heads", "d_kv")]
  return bindings


def build_decode(size, length, new_tokens, cached):
  """(graph, mesh, prompts placeholder, decoded ids) of greedy decoding new_tokens
  after the prompt, on the gin-configured LM, by the cached or the recompute path."""
  import gin  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.transformer import decoding, utils  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  s = common.TRANSFORMER_SIZES[size]
  gin.clear_config()
  try:
    gin_setup.parse_gin(GIN_FILES, _size_bindings(size, length))
    model = utils.build_model(model_type="lm", input_vocab_size=s["vocab"],
                              output_vocab_size=s["vocab"])
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    dims = [mtf.Dimension("batch", s["batch"]), mtf.Dimension("length", length)]
    prompts = mtf.import_tf_tensor(mesh, tf.TensorSpec([s["batch"], length], tf.int32),
                                   dims, name="prompts")
    with decoding.decoding_mode(cached):
      if cached and not decoding.supports_incremental_decoding(model):
        raise ValueError("the model does not support cached decoding")
      ids = model.sample_autoregressive(prompts, never_end=True, max_steps=new_tokens,
                                        variable_dtype=utils.get_variable_dtype())
    return graph, mesh, prompts, ids
  finally:
    gin.clear_config()


random_prompts = common.random_prompts


def decode_fns(size, new_tokens, prompt_length, checkpoint_dir):
  """{path: zero-argument tf.function decoding the prompts} with the same weights."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  length = prompt_length + new_tokens
  prompts = tf.constant(random_prompts(size, length, prompt_length))
  impl = mtf.PlacementMeshImpl("", "", ["/cpu:0"])
  fns = {}
  for path in PATHS:
    graph, mesh, placeholder, ids = build_decode(size, length, new_tokens,
                                                 path == "cached")
    lowering = mtf.Lowering(graph, {mesh: impl})  # creates the variables
    if path == "recompute":
      mtf.save_checkpoint(checkpoint_dir, lowering)
    else:
      mtf.restore_checkpoint(checkpoint_dir, lowering)

    @tf.function
    def decode(graph=graph, mesh=mesh, placeholder=placeholder, ids=ids):
      return mtf.Lowering(graph, {mesh: impl}, feeds={placeholder: prompts}
                          ).export_to_tf_tensor(ids)
    fns[path] = decode
  return fns


def main(_):
  s = common.TRANSFORMER_SIZES[FLAGS.size]
  print(common.machine_line())
  sizes = {k: v for k, v in s.items() if k != "length"}
  print("greedy decoding, Unitransformer LM (%s, size %s: %s), one device, prompt %d "
        "tokens, length and max_length = prompt + new tokens; median of %d decodes per "
        "path, alternating" % (" + ".join(GIN_FILES), FLAGS.size, sizes,
                               FLAGS.prompt_length, FLAGS.repeats))
  rows = [["new tokens", "recompute tok/s", "cached tok/s", "cached / recompute",
           "same ids"]]
  for n in [int(x) for x in FLAGS.new_tokens]:
    with tempfile.TemporaryDirectory() as tmp:
      fns = decode_fns(FLAGS.size, n, FLAGS.prompt_length, os.path.join(tmp, "w"))
      same = bool(np.array_equal(fns["recompute"]().numpy(), fns["cached"]().numpy()))
      times = common.time_alternating(fns, 1, FLAGS.repeats)
    tokens = s["batch"] * n
    rows.append([str(n), "%.0f" % (tokens / times["recompute"]),
                 "%.0f" % (tokens / times["cached"]),
                 "%.2f" % (times["recompute"] / times["cached"]), str(same)])
  common.print_table(rows)


if __name__ == "__main__":
  app.run(main)
