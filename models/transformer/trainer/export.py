"""Export mode: a SavedModel that decodes token ids (and text) without mesh_tf.

The decoding graph is lowered on one device and traced into plain TF, so
`tf.saved_model.load` needs only TensorFlow. Signatures: see build_module.
"""
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.trainer import decode_io
from models.transformer.trainer import run_record


def _checked_prompts(ids, length, vocab_size):
  """ids[:, :length], after checking each row's prompt (up to its last nonzero id) is at
  most length - 1 ids and every id in [0, vocab_size) (else InvalidArgumentError)."""
  positions = tf.range(1, tf.shape(ids)[1] + 1)
  prompt_lengths = tf.reduce_max(tf.where(tf.not_equal(ids, 0), positions, 0), axis=1)
  longest = tf.reduce_max(tf.concat([prompt_lengths, [0]], 0))
  checks = [
      tf.debugging.assert_less_equal(
          longest, length - 1, message="a prompt is longer than this export allows "
          "(%d tokens: the exported length %d less one for the output); shorten it or "
          "export with a larger sequence_length" % (length - 1, length)),
      tf.debugging.assert_non_negative(ids, message="token ids must be >= 0"),
      tf.debugging.assert_less(ids, vocab_size, message="token ids must be < the "
                               "vocabulary size %d" % vocab_size)]
  with tf.control_dependencies(checks):
    return tf.identity(ids[:, :length])


def _with_eos(ids, length, eos_id):
  """ids [n, m <= length] zero-padded to [n, length], with eos_id after each row's
  prompt (its ids up to the last nonzero one): a "delimited_lm"'s inputs."""
  ids = tf.pad(ids, [[0, 0], [0, length - tf.shape(ids)[1]]])
  positions = tf.range(1, length + 1)
  prompt_lengths = tf.reduce_max(tf.where(tf.not_equal(ids, 0), positions, 0), axis=1)
  return ids + eos_id * tf.one_hot(prompt_lengths, length, dtype=tf.int32)


def _decode_in_batches(decode_fn, ids, batch_size, length, output_length=None):
  """decode_fn (fixed [batch_size, length] -> [batch_size, output_length], default
  length) over any number of rows: zero-pads ids to whole batches of full length and
  decodes one batch after another."""
  output_length = output_length or length
  n = tf.shape(ids)[0]
  batches = (n + batch_size - 1) // batch_size
  ids = tf.pad(ids, [[0, batches * batch_size - n], [0, length - tf.shape(ids)[1]]])
  ids = tf.reshape(ids, [batches, batch_size, length])
  outputs = tf.map_fn(decode_fn, ids, fn_output_signature=tf.TensorSpec(
      [batch_size, output_length], tf.int32))
  return tf.reshape(outputs, [batches * batch_size, output_length])[:n]


_PYTHON_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")


def _calls_python(concrete_function):
  """Whether a traced function (or a function it calls, e.g. a map_fn body) runs
  Python through tf.numpy_function / tf.py_function."""
  graph_def = concrete_function.graph.as_graph_def()
  ops = [node.op for node in graph_def.node]
  for function in graph_def.library.function:
    ops += [node.op for node in function.node_def]
  return any(op in _PYTHON_OPS for op in ops)


def build_module(decode_fn, vocabulary, batch_size, length, output_length=None,
                 eos_id=None):
  """(tf.Module tracking the variables the signatures read, {name: signature}).

  "ids": ids = int32 [n, m] -> {"outputs": int32 [n, length] decoded ids, zero after
  EOS}. "serving_default": input = tf.string [n] -> {"inputs": the prompts as the model
  saw them, "outputs": the decoded text} if the vocabulary's encode_tf and decode_tf are
  TF ops (a loaded SavedModel cannot run tf.numpy_function), else "ids".
  Prompts are decoded in batches of batch_size; one longer than length - 1 ids, or an
  id outside the vocabulary, is an error. With eos_id (a "delimited_lm"), eos_id goes
  after each prompt, and the decodes have output_length positions.
  """
  module = tf.Module()
  vocab_size = decode_io.vocab_size(vocabulary)

  @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
  def decode_ids(ids):
    ids = _checked_prompts(ids, length, vocab_size)
    if eos_id is not None:
      ids = _with_eos(ids, length, eos_id)
    outputs = _decode_in_batches(decode_fn, ids, batch_size, length, output_length)
    return {"outputs": decode_io.clean_decodes(outputs)}

  module.decode_ids = decode_ids
  ids_signature = decode_ids.get_concrete_function()
  signatures = {"serving_default": ids_signature, "ids": ids_signature}
  if hasattr(vocabulary, "encode_tf") and hasattr(vocabulary, "decode_tf"):
    def encode_one(text):
      ids = tf.cast(vocabulary.encode_tf(text), tf.int32)
      check = tf.debugging.assert_less_equal(
          tf.shape(ids)[0], length - 1, message="a prompt is longer than this export "
          "allows (%d tokens: the exported length %d less one for the output)"
          % (length - 1, length))
      # The check must run before the pad, which fails on its own on a long prompt.
      with tf.control_dependencies([check]):
        return tf.pad(ids[:length - 1], [[0, length - 1 - tf.shape(ids)[0]]])

    # The spec's name is the signature's input key: "input", as the original's (its
    # serving receiver was a single string tensor, which Estimator names so).
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="input")])
    def decode_text(input):  # pylint: disable=redefined-builtin
      ids = tf.map_fn(encode_one, input, fn_output_signature=tf.TensorSpec(
          [length - 1], tf.int32))
      outputs = decode_ids(ids)["outputs"]
      return {"inputs": vocabulary.decode_tf(ids),
              "outputs": vocabulary.decode_tf(outputs)}
    module.decode_text = decode_text
    text_signature = decode_text.get_concrete_function()
    if _calls_python(text_signature):
      print("export: the vocabulary's encode_tf/decode_tf run Python "
            "(tf.numpy_function), which a loaded SavedModel cannot call; "
            "\"serving_default\" takes ids (use a vocabulary made of TF ops, e.g. "
            "ByteVocabulary, to serve strings)", flush=True)
    else:
      signatures["serving_default"] = text_signature
  module.tracked_variables = list({id(v): v for f in signatures.values()
                                   for v in f.variables}.values())
  return module, signatures


def run_export(model_fn, model_dir, checkpoint_path, vocabulary, batch_size,
               sequence_length, variable_dtype, export_path):
  """Export mode of utils.run: restores on one device and saves the SavedModel. A
  "delimited_lm" decodes "prompt EOS" with room for the targets length after it."""
  from models.transformer import model_graph  # pylint: disable=g-import-not-at-top
  model = model_fn()
  delimited = model_graph.model_type_of(model) == "delimited_lm"
  length = model_graph.feature_length(sequence_length, "targets")
  continuation = 0
  if delimited:
    continuation = length
    if isinstance(sequence_length, dict) and "inputs" in sequence_length:
      length = model_graph.feature_length(sequence_length, "inputs")
  mesh_impl = mtf.PlacementMeshImpl("", "", [""])
  graph = decode_io.DecodeGraph(model, batch_size, length, variable_dtype,
                                any_mesh=True, continuation_length=continuation,
                                mode="export")
  decode_fn = graph.make_decode_fn(mesh_impl)
  restored = run_record.restore(checkpoint_path or model_dir, mesh_impl)
  module, signatures = build_module(decode_fn, vocabulary, batch_size, length,
                                    graph.output_length, 1 if delimited else None)
  tf.saved_model.save(module, export_path, signatures=signatures)
  print("exported %s (step %s) to %s" % (restored.path, restored.global_step, export_path),
        flush=True)
  return export_path
