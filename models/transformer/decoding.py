"""Decoding with the Transformer models: greedy, temperature sampling and beam search.

Each decoding step runs the model's full forward pass on the ids decoded so far (through
the public `call_simple`) and reads the logits at the position being decoded. This is
simpler than the original's incremental key/value cache and gives the same ids; it costs
O(length) forward passes of the whole sequence. The model is called once before the
decoding loop, so its variables exist there and the calls inside the loop reuse them.
"""
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import beam_search as mtf_beam_search
from models.transformer.context import ModeKeys

BEAM_DIM_NAME = "beam"


def keep_top_k_logits(logits, vocab_dim, k):
  """logits with every entry below the k-th largest along vocab_dim set to -INF."""
  if k is None or k <= 0 or k >= vocab_dim.size:
    return logits
  kth = mtf.nth_largest_element(logits, k - 1, vocab_dim)
  return mtf.where(mtf.less(logits, kth), -mtf_beam_search.INF, logits)


def mask_padded_vocab(logits, vocab_dim, vocab_size):
  """logits with the ids >= vocab_size (the padding of the vocab dim) set to -INF."""
  if vocab_size is None or vocab_size >= vocab_dim.size:
    return logits
  padded = mtf.cast(mtf.greater_equal(mtf.range(logits.mesh, vocab_dim, tf.int32),
                                      vocab_size), logits.dtype)
  return logits - padded * mtf_beam_search.INF


def _decoder_inputs(ids, bos_id):
  """The model inputs for ids: ids shifted right by one, bos_id first."""
  length_dim = ids.shape.dims[-1]
  inputs = mtf.shift(ids, offset=1, dim=length_dim, wrap=False)
  if bos_id:
    inputs += bos_id * mtf.one_hot(mtf.constant(ids.mesh, 0, dtype=tf.int32), length_dim,
                                   dtype=tf.int32)
  return inputs


def _check_decoder(model, fn_name):
  if not getattr(model, "autoregressive", False) or model.output_vocab_dim is None:
    raise mtf.MtfError("%s: model %r is not an autoregressive model with an output "
                       "vocabulary; only a decoder or language model can decode" % (
                           fn_name, getattr(model, "name", model)))


def _logits_fn(model, variable_dtype, bos_id, model_kwargs, temperature=None,
               sampling_keep_top_k=-1):
  """logits_fn(step, ids, states) for mtf.beam_search: the model's next-token logits."""
  vocab_dim = model.output_vocab_dim

  def logits_fn(step, ids, states):
    logits, _ = model.call_simple(
        inputs=_decoder_inputs(ids, bos_id), targets=None, compute_loss=False,
        mode=ModeKeys.PREDICT, variable_dtype=variable_dtype, **model_kwargs)
    logits = mtf.gather(mtf.cast(logits, tf.float32), step, ids.shape.dims[-1])
    logits = mask_padded_vocab(logits, vocab_dim, model.output_vocab_size)
    if temperature is not None:
      logits = keep_top_k_logits(logits, vocab_dim, sampling_keep_top_k)
    return logits, states
  return logits_fn


def _model_kwargs(encoder_output, encoder_sequence_id, encoder_inputs, shared_params,
                  encoder_layer_outputs):
  return dict(encoder_output=encoder_output, encoder_sequence_id=encoder_sequence_id,
              encoder_inputs=encoder_inputs, shared_params=shared_params,
              encoder_layer_outputs=encoder_layer_outputs)


def sample_autoregressive(model, partial_sequences, stop_at_token=1, max_steps=None,
                          temperature=0.0,
                          variable_dtype=mtf.VariableDType(tf.float32),
                          encoder_output=None, encoder_sequence_id=None,
                          encoder_inputs=None, shared_params=None,
                          has_partial_sequences=True, encoder_layer_outputs=None,
                          never_end=False, remove_partial_sequences=False,
                          sampling_keep_top_k=-1, bos_id=0):
  """Continues partial_sequences with a Unitransformer, greedily or by sampling.

  Args:
    model: an autoregressive Unitransformer.
    partial_sequences: int32 [batch..., length]; nonzero ids are a prompt, zeros are
      decoded (left to right from the first zero).
    stop_at_token: a sequence ends at the first such id it generates (0 after it).
    max_steps: decode at most this many positions (None: to the end of length).
    temperature: 0.0 for argmax, else softmax(logits / temperature) sampling.
    variable_dtype: the model's mtf.VariableDType.
    encoder_output, encoder_sequence_id, encoder_inputs, shared_params,
      encoder_layer_outputs: passed to the model (a Bitransformer's decoder).
    has_partial_sequences: False ignores partial_sequences' ids (decode everything).
    never_end: do not stop at stop_at_token.
    remove_partial_sequences: zero the prompt positions in the result.
    sampling_keep_top_k: sample only among the k most likely ids (-1: all).
    bos_id: the input id read at the first position.

  Returns:
    int32 Tensor shaped like partial_sequences.
  """
  _check_decoder(model, "sample_autoregressive")
  if not has_partial_sequences:
    partial_sequences = mtf.zeros_like(partial_sequences)
  kwargs = _model_kwargs(encoder_output, encoder_sequence_id, encoder_inputs,
                         shared_params, encoder_layer_outputs)
  # Creates the model's variables outside the loop; the calls inside reuse them.
  model.call_simple(inputs=_decoder_inputs(partial_sequences, bos_id), targets=None,
                    compute_loss=False, mode=ModeKeys.PREDICT,
                    variable_dtype=variable_dtype, **kwargs)
  logits_fn = _logits_fn(model, variable_dtype, bos_id, kwargs, temperature,
                         sampling_keep_top_k)
  ids = mtf_beam_search.greedy_decode(
      logits_fn, partial_sequences, temperature=temperature,
      eos_id=-1 if never_end else stop_at_token, max_steps=max_steps)
  if remove_partial_sequences:
    ids *= mtf.cast(mtf.equal(partial_sequences, 0), tf.int32)
  return ids


def _with_beam(x, beam_dim):
  """x [batch..., a, b] broadcast to [batch..., beam, a, b] (None stays None)."""
  if x is None or beam_dim in x.shape.dims:
    return x
  dims = x.shape.dims
  return mtf.broadcast(x, dims[:-2] + [beam_dim] + dims[-2:])


def beam_search(model, inputs, decode_length,
                variable_dtype=mtf.VariableDType(tf.float32), encoder_output=None,
                encoder_sequence_id=None, encoder_inputs=None, alpha=0.6,
                shared_params=None, encoder_layer_outputs=None, bos_id=0):
  """Beam search with a Unitransformer; returns the best beam, [batch..., length].

  Args:
    model: an autoregressive Unitransformer.
    inputs: int32 [batch..., beam, length]: zeros, or a prompt (nonzero ids) to continue.
    decode_length: at most this many positions are decoded (int or scalar int Tensor).
    variable_dtype: the model's mtf.VariableDType.
    encoder_output, encoder_sequence_id, encoder_inputs, shared_params,
      encoder_layer_outputs: passed to the model (a Bitransformer's decoder); tensors
      without the beam dim are broadcast over it.
    alpha: the length-penalty exponent.
    bos_id: the input id read at the first position.
  """
  _check_decoder(model, "beam_search")
  if inputs.shape.ndims < 2 or inputs.shape.dims[-2].name != BEAM_DIM_NAME:
    raise mtf.ShapeError(
        "beam_search: inputs %s %s must be [batch..., beam, length] with a dim named "
        "%r before the length" % (inputs.name, inputs.shape, BEAM_DIM_NAME),
        tensor=inputs.name, dim=BEAM_DIM_NAME)
  beam_dim = inputs.shape.dims[-2]
  encoder_output = _with_beam(encoder_output, beam_dim)
  if encoder_sequence_id is not None and beam_dim not in encoder_sequence_id.shape.dims:
    dims = encoder_sequence_id.shape.dims
    encoder_sequence_id = mtf.broadcast(encoder_sequence_id,
                                        dims[:-1] + [beam_dim] + dims[-1:])
  if encoder_inputs is not None and beam_dim not in encoder_inputs.shape.dims:
    dims = encoder_inputs.shape.dims
    encoder_inputs = mtf.broadcast(encoder_inputs, dims[:-1] + [beam_dim] + dims[-1:])
  kwargs = _model_kwargs(encoder_output, encoder_sequence_id, encoder_inputs,
                         shared_params, encoder_layer_outputs)
  model.call_simple(inputs=_decoder_inputs(inputs, bos_id), targets=None,
                    compute_loss=False, mode=ModeKeys.PREDICT,
                    variable_dtype=variable_dtype, **kwargs)
  beams, _ = mtf_beam_search.beam_search(
      _logits_fn(model, variable_dtype, bos_id, kwargs), inputs, alpha,
      decode_length=decode_length)
  return mtf.gather(beams, mtf.constant(inputs.mesh, 0, dtype=tf.int32), beam_dim)


def encode_for_decoding(model, inputs, variable_dtype=mtf.VariableDType(tf.float32)):
  """Runs a Bitransformer's encoder once for decoding; returns the keyword arguments
  its decoder needs (see Bitransformer.encode). Padding (id 0) in inputs is masked."""
  encoded, _ = model.encode(inputs, False, mode=ModeKeys.PREDICT,
                            variable_dtype=variable_dtype)
  return encoded


def bitransformer_decode(model, inputs, variable_dtype=mtf.VariableDType(tf.float32),
                         beam_size=1, alpha=0.6, temperature=0.0, sampling_keep_top_k=-1,
                         decode_length_multiplier=1.5, decode_length_constant=10,
                         max_decode_length=None):
  """Encodes inputs once and decodes outputs with the decoder: greedy or sampled
  (beam_size 1) or by beam search.

  Args:
    model: a Bitransformer.
    inputs: int32 [batch..., length] input ids (0 = padding, which the encoder masks).
    variable_dtype: the model's mtf.VariableDType.
    beam_size: 1 for greedy / sampling, more for beam search.
    alpha: beam search's length-penalty exponent.
    temperature, sampling_keep_top_k: sampling settings (beam_size 1).
    decode_length_multiplier, decode_length_constant: beam search decodes at most
      multiplier * (longest input) + constant positions.
    max_decode_length: the length of the outputs (None: the inputs' length).

  Returns:
    int32 [batch..., decode length] output ids.
  """
  if beam_size < 1:
    raise mtf.MtfError("bitransformer_decode: beam_size=%r must be >= 1" % (beam_size,))
  mesh = inputs.mesh
  length_dim = inputs.shape.dims[-1]
  batch_dims = inputs.shape.dims[:-1]
  encoded = encode_for_decoding(model, inputs, variable_dtype)
  decode_length_dim = (length_dim if max_decode_length is None
                       else mtf.Dimension(length_dim.name, max_decode_length))
  if beam_size == 1:
    partial = mtf.zeros(mesh, batch_dims + [decode_length_dim], tf.int32)
    return sample_autoregressive(
        model.decoder, partial, temperature=temperature,
        sampling_keep_top_k=sampling_keep_top_k, variable_dtype=variable_dtype,
        has_partial_sequences=False, **encoded)
  beam_dim = mtf.Dimension(BEAM_DIM_NAME, beam_size)
  partial = mtf.zeros(mesh, batch_dims + [beam_dim, decode_length_dim], tf.int32)
  input_length = mtf.reduce_sum(mtf.minimum(inputs, 1), reduced_dim=length_dim)
  decode_length = mtf.cast(
      mtf.cast(mtf.reduce_max(input_length), tf.float32) * decode_length_multiplier
      + decode_length_constant, tf.int32)
  return beam_search(model.decoder, partial, decode_length,
                     variable_dtype=variable_dtype, alpha=alpha, **encoded)
