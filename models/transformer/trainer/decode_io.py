"""Decode mode: prompts from a file (one per line), decoded by the model, text out.

The decoding graph is built once for a fixed [batch, length] of zero-padded prompt ids,
decoded in batches. LMs continue each prompt; a "delimited_lm" continues "prompt EOS"
in room for a target after it; encoder-decoder models translate it. Greedy at
temperature 0, sampling above; beam_size > 1 runs beam search.
"""
import itertools

import gin
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import model_graph
from models.transformer import model_layout
from models.transformer.trainer import run_record

DEFAULT_PROMPTS = ("The ", "In the beginning ", "A function ", "When the ")


def check_can_decode(model, mode):
  """MtfError if model's type cannot decode (in utils.run mode `mode`)."""
  if model_graph.model_type_of(model) == "aligned":
    raise mtf.MtfError(
        "model_type 'aligned' cannot run mode %r: it is not autoregressive, so it has no "
        "decoding (train, eval and scoring work; use 'lm', 'delimited_lm' or "
        "'bitransformer' to decode)" % (mode,))


class DecodeGraph:
  """The mtf graph decoding an int32 [batch, length] "inputs" placeholder.

  continuation_length: zero positions appended to the prompts for the decode to fill
  (a "delimited_lm"'s targets length); the outputs have length + continuation_length
  positions (`output_length`). any_mesh: lower on any mesh, not only the model's
  (export runs the model as trained, MoE groups included, on one device).
  """

  def __init__(self, model, batch_size, length, variable_dtype, temperature=0.0,
               beam_size=1, alpha=0.6, any_mesh=False, continuation_length=0,
               mode="decode"):
    check_can_decode(model, mode)
    self.model, self.any_mesh = model, any_mesh
    self.graph = mtf.Graph()
    self.mesh = mtf.Mesh(self.graph, "my_mesh")
    self.batch_size, self.length = batch_size, length
    dims = [mtf.Dimension("batch", batch_size), mtf.Dimension("length", length)]
    self.inputs = mtf.import_tf_tensor(
        self.mesh, tf.TensorSpec([batch_size, length], tf.int32), dims, name="inputs")
    self.output_length = length + continuation_length
    prompts = self.inputs
    if continuation_length:
      prompts = mtf.pad(self.inputs, [0, continuation_length], "length")
      dims = prompts.shape.dims
    if model_graph.is_bitransformer(model):
      self.outputs = model.decode(self.inputs, variable_dtype=variable_dtype,
                                  beam_size=beam_size, alpha=alpha,
                                  temperature=temperature)
    elif beam_size > 1:
      # An LM's beam search reads [batch, beam, length]; like sampling below, the
      # result keeps only the continuation (the prompt positions are zeroed).
      beam_dims = dims[:1] + [mtf.Dimension("beam", beam_size)] + dims[1:]
      best = model.beam_search(mtf.broadcast(prompts, beam_dims),
                               decode_length=self.output_length, alpha=alpha,
                               variable_dtype=variable_dtype)
      self.outputs = best * mtf.cast(mtf.equal(prompts, 0), tf.int32)
    else:
      self.outputs = model.sample_autoregressive(
          prompts, temperature=temperature, variable_dtype=variable_dtype,
          remove_partial_sequences=True)

  def lowering(self, mesh_impl, inputs=None):
    """A Lowering on mesh_impl, fed with prompt ids (None: variables only); a
    LayoutError if the model was built for another layout."""
    if not self.any_mesh:
      model_layout.check_agrees(self.model, mesh_impl)
    feeds = {} if inputs is None else {self.inputs: inputs}
    return mtf.Lowering(self.graph, {self.mesh: mesh_impl}, feeds=feeds)

  def make_decode_fn(self, mesh_impl):
    """A tf.function(int32 [batch, length]) -> decoded int32 ids (XLA-compiled when
    the backend needs it, mesh_impl.needs_xla)."""
    self.lowering(mesh_impl)

    @tf.function(jit_compile=mesh_impl.needs_xla)
    def decode(inputs):
      return self.lowering(mesh_impl, inputs).export_to_tf_tensor(self.outputs)
    return decode


def vocab_size(vocabulary):
  """A vocabulary's size, whether it offers vocab_size as a property or a method."""
  size = vocabulary.vocab_size
  return size() if callable(size) else size


def encode_prompts(prompts, vocabulary, batch_size, length, eos_id=None):
  """int32 [n_batches * batch_size, length] prompt ids, zero-padded (ids trimmed to
  length - 1); with eos_id, each prompt ends with it (a "delimited_lm"'s inputs)."""
  rows = int(np.ceil(max(len(prompts), 1) / batch_size)) * batch_size
  ids = np.zeros([rows, length], np.int32)
  for i, prompt in enumerate(prompts):
    encoded = list(vocabulary.encode(prompt))[:length - 1]
    if eos_id is not None:
      encoded.append(eos_id)
    ids[i, :len(encoded)] = encoded
  return ids


def ids_to_text(ids, vocabulary, eos_id=1):
  """Text of one row of ids, cut at the first EOS; padding (0) is skipped (decoded LM
  rows hold 0 where the prompt was)."""
  ids = itertools.takewhile(lambda i: i != eos_id, np.asarray(ids).tolist())
  return vocabulary.decode([i for i in ids if i])


def decode_prompts(decode_fn, vocabulary, batch_size, length, input_filename=None,
                   output_filename=None, prompts=None, eos_id=None):
  """Decodes every prompt of input_filename (or prompts / DEFAULT_PROMPTS); writes one
  output line per prompt to output_filename (if given); returns the lines. eos_id:
  see encode_prompts."""
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  if input_filename:
    prompts = utils.get_inputs_from_file(input_filename)
  prompts = list(prompts if prompts is not None else DEFAULT_PROMPTS)
  ids = encode_prompts(prompts, vocabulary, batch_size, length, eos_id)
  lines = []
  for start in range(0, ids.shape[0], batch_size):
    decoded = decode_fn(tf.constant(ids[start:start + batch_size])).numpy()
    for row in decoded:
      # One output line per prompt: "\r" too, as text readers take it for a line break.
      lines.append(ids_to_text(row, vocabulary).replace("\r", " ").replace("\n", " "))
  lines = lines[:len(prompts)]
  for prompt, line in zip(prompts, lines):
    print("%r -> %r" % (prompt, line), flush=True)
  if output_filename:
    utils.write_lines_to_file(lines, output_filename)
  return lines


@gin.configurable(module="utils")
def decode_options(temperature=0.0, beam_size=1, alpha=0.6):
  """How decode mode decodes: sampling temperature (0: greedy), beam size, alpha."""
  return {"temperature": temperature, "beam_size": beam_size, "alpha": alpha}


def run_decode(model_fn, mesh_impl, model_dir, checkpoint_path, vocabulary, batch_size,
               sequence_length, variable_dtype, input_filename, output_filename):
  """Decode mode of utils.run: restores the checkpoint and decodes the prompts (a
  "delimited_lm" continues "prompt EOS" for up to the targets length or more)."""
  length = model_graph.feature_length(sequence_length, "inputs" if isinstance(
      sequence_length, dict) and "inputs" in sequence_length else "targets")
  model = model_fn()
  delimited = model_graph.model_type_of(model) == "delimited_lm"
  continuation = (model_graph.feature_length(sequence_length, "targets") if delimited
                  else 0)
  graph = DecodeGraph(model, batch_size, length, variable_dtype,
                      continuation_length=continuation, **decode_options())
  decode_fn = graph.make_decode_fn(mesh_impl)
  restored = run_record.restore(checkpoint_path or model_dir, mesh_impl)
  print("decoding with %s" % restored.path, flush=True)
  return decode_prompts(decode_fn, vocabulary, batch_size, length,
                        input_filename=input_filename, output_filename=output_filename,
                        eos_id=1 if delimited else None)


def clean_decodes(ids, eos_id=1, pad_id=0, length_axis=-1):
  """ids with every position after the first eos_id set to pad_id (a tf.Tensor)."""
  ids = tf.convert_to_tensor(ids)
  after_eos = tf.cumsum(tf.cast(tf.equal(ids, eos_id), tf.int32), axis=length_axis,
                        exclusive=True)
  return tf.where(tf.equal(after_eos, 0), ids, tf.cast(pad_id, ids.dtype))
