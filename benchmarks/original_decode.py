"""The original library's side of benchmarks/decode_speed.py: cached decoding of the
README LM with mesh-tensorflow 0.1.21 on TF 2.12 (TF1 graph mode, one Session per
case), on the weights of a checkpoint the port wrote (restored by variable name).

Runs in the original's own virtual environment, e.g.

  /tmp/tf212/bin/python benchmarks/original_decode.py --checkpoint_dir DIR \
      --new_tokens 64 --cases greedy,sampling,beam4 --meshes 1,2x2

and prints one JSON line: {"case/mesh": {"tok_s": tokens/s, "seconds": per decode,
"ids": decoded ids (greedy only)}, "_machine": "..."}. The model is built with the
original's Unitransformer and make_layer_stack from the same hyperparameters as the
port's gin files (2 layers, d_model 64, d_ff 256, 4 heads of 16, shared embedding and
softmax, learned positions, byte vocabulary padded to a multiple of 128, bfloat16
master / float32 slice and activation dtypes). Decoding: Unitransformer.
sample_autoregressive (greedy: temperature 0, sampling: temperature 1, neither stopping
at EOS) and Unitransformer.beam_search (4 beams, alpha 0.6), the prompts of
decode_speed.random_prompts (same generator and seed, reimplemented here: this file
does not import the port). As the port's decoding, the padded vocab ids are masked
(PaddedVocabMaskedUnitransformer) and EOS is neither masked nor a stop.
"""
import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
import types

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# mesh_tensorflow.transformer imports tensorflow_datasets, which decoding never uses.
sys.modules.setdefault("tensorflow_datasets", types.ModuleType("tensorflow_datasets"))

import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()

import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
from mesh_tensorflow.transformer import transformer_layers  # pylint: disable=g-import-not-at-top

MESHES = {"1": ("", "", 1),
          "2x2": ("batch:2;model:2", "batch:batch;d_ff:model;heads:model;vocab:model", 4)}
CASES = {"greedy": dict(temperature=0.0, beam=1),
         "sampling": dict(temperature=1.0, beam=1),
         "beam4": dict(temperature=0.0, beam=4)}


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint_dir", required=True)
  p.add_argument("--new_tokens", type=int, default=64)
  p.add_argument("--prompt_length", type=int, default=8)
  p.add_argument("--max_length", type=int, default=None)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--cases", default="greedy,sampling,beam4")
  p.add_argument("--meshes", default="1,2x2")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--vocab", type=int, default=259)
  p.add_argument("--num_layers", type=int, default=2)
  p.add_argument("--d_model", type=int, default=64)
  p.add_argument("--d_ff", type=int, default=256)
  p.add_argument("--num_heads", type=int, default=4)
  p.add_argument("--d_kv", type=int, default=16)
  return p.parse_args(argv)


def random_prompts(batch, vocab, length, prompt_length, seed=0):
  """As decode_speed.random_prompts: prompt_length random non-EOS ids, then zeros."""
  rng = np.random.RandomState(seed)
  ids = np.zeros([batch, length], np.int32)
  ids[:, :prompt_length] = rng.randint(2, vocab, size=[batch, prompt_length])
  return ids


# An id no sequence holds and the model never emits (a padded vocab id, masked below).
NEVER_ID = 300


class PaddedVocabMaskedUnitransformer(transformer.Unitransformer):
  """The original's Unitransformer with the logits of the padded vocab ids (>= the
  unpadded size) set to -1e9, as the port's decoding does (decoding.mask_padded_vocab),
  so that both decode the same ids from the same weights; one elementwise op per step."""

  def _call_internal(self, context, inputs, targets=None):
    logits = super()._call_internal(context, inputs, targets)
    vocab_dim = self.output_vocab_dim
    padded = mtf.cast(mtf.greater_equal(mtf.range(logits.mesh, vocab_dim, tf.int32),
                                        self.output_vocab_size_unpadded), logits.dtype)
    return logits - padded * 1e9


def build_model(a, length, mesh_key):
  mesh_shape, layout, _ = MESHES[mesh_key]
  layers = [[transformer_layers.SelfAttention,
             dict(num_heads=a.num_heads, key_value_size=a.d_kv, dropout_rate=0.0)],
            [transformer_layers.DenseReluDense,
             dict(hidden_size=a.d_ff, dropout_rate=0.0)]]
  # The sublayers of the port's gin_configs/defaults.gin (gin-configured in the
  # original too, so given here).
  stack_cls = functools.partial(
      transformer.LayerStack,
      sublayers_initial=[transformer.sublayer_dropout],
      sublayers_per_layer=[transformer.sublayer_rms_norm,
                           transformer.sublayer_call_layer,
                           transformer.sublayer_dropout,
                           transformer.sublayer_residual],
      sublayers_final=[transformer.sublayer_rms_norm, transformer.sublayer_dropout])
  stack = transformer.make_layer_stack(layers=layers, layer_stack_cls=stack_cls,
                                       num_layers=a.num_layers, block_scope=True)
  return PaddedVocabMaskedUnitransformer(
      layer_stack=stack, d_model=a.d_model, input_vocab_size=a.vocab,
      output_vocab_size=a.vocab, autoregressive=True,
      max_length=a.max_length or length, shared_embedding_and_softmax_weights=True,
      z_loss=1e-4, name="transformer", layout=layout or None,
      mesh_shape=mesh_shape or None)


def build_case(a, case, mesh_key):
  """(tf.Graph, Session, decoded ids tf.Tensor) of one case, weights restored."""
  length = a.prompt_length + a.new_tokens
  spec = CASES[case]
  mesh_shape, layout, n = MESHES[mesh_key]
  tf_graph = tf.Graph()
  with tf_graph.as_default():
    tf.set_random_seed(1234)
    model = build_model(a, length, mesh_key)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    batch_dim = mtf.Dimension("batch", a.batch)
    length_dim = mtf.Dimension("length", length)
    prompts = mtf.import_tf_tensor(
        mesh, tf.constant(random_prompts(a.batch, a.vocab, length, a.prompt_length)),
        mtf.Shape([batch_dim, length_dim]))
    variable_dtype = mtf.VariableDType(master_dtype=tf.bfloat16,
                                       slice_dtype=tf.float32,
                                       activation_dtype=tf.float32)
    if spec["beam"] > 1:
      beam_dim = mtf.Dimension("beam", spec["beam"])
      beams = mtf.broadcast(prompts, mtf.Shape([batch_dim, beam_dim, length_dim]))
      ids = model.beam_search(beams, decode_length=length, alpha=0.6,
                              variable_dtype=variable_dtype)
    else:
      # Stops only at NEVER_ID and does not mask EOS, as the port's never_end.
      ids = model.sample_autoregressive(prompts, stop_at_token=NEVER_ID,
                                        max_steps=a.new_tokens,
                                        temperature=spec["temperature"],
                                        variable_dtype=variable_dtype)
    devices = ["/cpu:%d" % i for i in range(n)]
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        mtf.convert_to_shape(mesh_shape), mtf.convert_to_layout_rules(layout), devices)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_ids = lowering.export_to_tf_tensor(ids)
    saver = tf.train.Saver(tf.global_variables())
    copy = lowering.copy_masters_to_slices()
    config = tf.ConfigProto(device_count={"CPU": 4}, allow_soft_placement=True)
    sess = tf.Session(graph=tf_graph, config=config)
    sess.run(tf.global_variables_initializer())
    sess.run(tf.local_variables_initializer())
    saver.restore(sess, tf.train.latest_checkpoint(a.checkpoint_dir)
                  or os.path.join(a.checkpoint_dir, "model.ckpt"))
    sess.run(copy)
  return tf_graph, sess, tf_ids


def main(argv):
  a = parse_args(argv)
  cases = [c for c in a.cases.split(",") if c]
  meshes = [m for m in a.meshes.split(",") if m]
  built = {}
  for m in meshes:
    for c in cases:
      built["%s/%s" % (c, m)] = build_case(a, c, m)
  out, samples = {}, {k: [] for k in built}
  for k, (_, sess, tf_ids) in built.items():
    ids = sess.run(tf_ids)  # warm-up
    out[k] = {"ids": ids.tolist()} if k.startswith("greedy/") else {}
  for _ in range(a.repeats):
    for k, (_, sess, tf_ids) in built.items():
      start = time.perf_counter()
      sess.run(tf_ids)
      samples[k].append(time.perf_counter() - start)
  for k, v in samples.items():
    t = statistics.median(v)
    out[k].update(seconds=t, tok_s=a.batch * a.new_tokens / t)
  for _, sess, _ in built.values():
    sess.close()
  out["_machine"] = "Python %s, TensorFlow %s, mesh-tensorflow %s" % (
      platform.python_version(), tf.__version__,
      getattr(mtf, "__version__", "0.1.21"))
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1:])
