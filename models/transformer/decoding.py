"""Decoding with the Transformer models: greedy, temperature sampling and beam search.

Two ways to get the logits of the position being decoded, with the same results:
- cached (the default where the model supports it, as in the original): one run on the
  whole sequence in "first_part" mode fills the attention layers' key/value caches from
  the prompt; each step then runs the model on one position in "incremental" mode.
- recompute: each step runs `call_simple` on the ids decoded so far, O(length^2) per
  step; for layers that are not incremental-aware (e.g. MoE, Fixup stacks) and for
  `decoding_mode(cached=False)`.
"""
import contextlib

import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import beam_search as mtf_beam_search
from models.transformer import cache_write
from models.transformer import layer_stack as layer_stack_lib
from models.transformer.context import Context, ModeKeys

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


_CACHED_OVERRIDE = []


@gin.configurable(module="decoding")
def use_cached_decoding(cached=True):
  """Whether decoding uses the key/value caches where the model supports them (gin:
  `decoding.use_cached_decoding.cached = False` recomputes the prefix at every step)."""
  return cached


@contextlib.contextmanager
def decoding_mode(cached):
  """Within the block, decoding is cached (True, where the model supports it) or
  recomputes the prefix at every step (False), whatever gin says."""
  _CACHED_OVERRIDE.append(bool(cached))
  try:
    yield
  finally:
    _CACHED_OVERRIDE.pop()


def layer_supports_incremental(layer):
  """Whether a layer's call handles the decoding modes (see context.incremental_aware)
  and the layer's settings allow it (its supports_incremental_decoding, if any)."""
  if not getattr(type(layer).call, "incremental_aware", False):
    return False
  return bool(getattr(layer, "supports_incremental_decoding", True))


def _position_wise_sublayers():
  return {v for v in vars(layer_stack_lib).values()
          if callable(v) and getattr(v, "__name__", "").startswith("sublayer_")}


def supports_incremental_decoding(model):
  """Whether cached decoding can run model: a causal Unitransformer (no ensemble, no
  fully attended inputs region) whose LayerStack holds only incremental-aware layers
  and the layer_stack module's sublayers."""
  from models.transformer.transformer import Unitransformer  # pylint: disable=g-import-not-at-top
  if not isinstance(model, Unitransformer):
    return False
  for name in ("_call_internal", "_embed", "_positional_embedding"):
    if getattr(type(model), name) is not getattr(Unitransformer, name):
      return False
  if model.ensemble_dim is not None or not model.fully_autoregressive:
    return False
  stack = model.layer_stack
  if (type(stack) is not layer_stack_lib.LayerStack  # pylint: disable=unidiomatic-typecheck
      or stack._recompute_grads):  # pylint: disable=protected-access
    return False
  known = _position_wise_sublayers()
  sublayers = (stack._sublayers_initial + stack._sublayers_per_layer  # pylint: disable=protected-access
               + stack._sublayers_final)  # pylint: disable=protected-access
  if any(s not in known for s in sublayers):
    return False
  return all(layer_supports_incremental(layer) for layer in stack.layers)


def _cached(model):
  cached = _CACHED_OVERRIDE[-1] if _CACHED_OVERRIDE else use_cached_decoding()
  return cached and supports_incremental_decoding(model)


def _finish_logits(model, logits, temperature, sampling_keep_top_k):
  vocab_dim = model.output_vocab_dim
  logits = mask_padded_vocab(mtf.cast(logits, tf.float32), vocab_dim,
                             model.output_vocab_size)
  if temperature is not None:
    logits = keep_top_k_logits(logits, vocab_dim, sampling_keep_top_k)
  return logits


def _logits_fn(model, variable_dtype, bos_id, model_kwargs, temperature=None,
               sampling_keep_top_k=-1):
  """logits_fn(step, ids, states) for mtf.beam_search: the model's next-token logits,
  recomputed over the whole sequence."""
  def logits_fn(step, ids, states):
    logits, _ = model.call_simple(
        inputs=_decoder_inputs(ids, bos_id), targets=None, compute_loss=False,
        mode=ModeKeys.PREDICT, variable_dtype=variable_dtype, **model_kwargs)
    logits = mtf.gather(logits, step, ids.shape.dims[-1])
    return _finish_logits(model, logits, temperature, sampling_keep_top_k), states
  return logits_fn


def _decoding_context(model, inputs, variable_dtype, mode, model_kwargs, **kwargs):
  kwargs.update(model_kwargs)
  kwargs["shared_params"] = kwargs.get("shared_params") or {}
  return Context(model=model, mesh=inputs.mesh, variable_dtype=variable_dtype, mode=mode,
                 inputs=inputs, new_states=[], **kwargs)


def _run_model(model, context, inputs):
  with mtf.variable_scope(model.name, reuse=model._built or None):  # pylint: disable=protected-access
    logits = model._call_internal(context, inputs)  # pylint: disable=protected-access
  model._built = True  # pylint: disable=protected-access
  return logits


def _prefill(model, ids, bos_id, variable_dtype, model_kwargs):
  """Runs model on the whole of ids in "first_part" mode (creating its variables);
  returns the decoding states it recorded (the caches, filled from the prompt) and its
  constant states (e.g. the keys and values of the encoder output)."""
  inputs = _decoder_inputs(ids, bos_id)
  length_dim = inputs.shape.dims[-1]
  # Where the decoding loop starts (the convolutions' states end there).
  decode_start = mtf_beam_search._decode_start(ids, length_dim)  # pylint: disable=protected-access
  length_range = mtf.range(inputs.mesh, length_dim, tf.int32)
  context = _decoding_context(
      model, inputs, variable_dtype, "first_part", model_kwargs,
      batch_dims=inputs.shape.dims[:-1], length_dim=length_dim, position=length_range,
      position_is_default=True, read_priority=length_range, write_priority=length_range,
      initial_position=decode_start, constant_states=[])
  _run_model(model, context, inputs)
  return context.new_states, context.constant_states


def _cache_layout(state):
  """A decoding state with its "memory_length" dim moved next to last ([batch, heads,
  memory_length, d_kv]), so each step's attention einsum reads the cache without
  transposing it (otherwise the largest per-step cost that grows with the length)."""
  dims = state.shape.dims
  names = [d.name for d in dims]
  if "memory_length" not in names or len(dims) < 3:
    return state
  i = names.index("memory_length")
  if i >= len(dims) - 2:
    return state
  order = dims[:i] + dims[i + 1:-1] + [dims[i], dims[-1]]
  return mtf.transpose(state, mtf.Shape(order))


def _loop_states(states):
  """The prefill's states in the loop layout, in buffers of their own
  (cache_write.private_copy) that the loop's per-step writes may go into."""
  return [cache_write.private_copy(_cache_layout(s)) for s in states]


def _incremental_logits_fn(model, variable_dtype, bos_id, model_kwargs, temperature=None,
                           sampling_keep_top_k=-1, constant_states=None):
  """logits_fn(step, ids, states) for mtf.beam_search from the decoding caches: the
  model runs on the one input id of position step."""
  def logits_fn(step, ids, states):
    length_dim = ids.shape.dims[-1]
    inputs = mtf.gather(_decoder_inputs(ids, bos_id), step, length_dim)
    context = _decoding_context(
        model, inputs, variable_dtype, "incremental", model_kwargs,
        batch_dims=inputs.shape.dims, length_dim=None, position=step, states=states,
        constant_states=constant_states)
    # the loop owns its states (_loop_states made them private), so their one-position
    # writes may go into their buffers
    context.write_states_in_place = True
    logits = _run_model(model, context, inputs)
    if len(context.new_states) != len(states):
      raise mtf.MtfError(
          "incremental decoding of %r: the layers recorded %d states in incremental "
          "mode but %d in first_part mode" % (model.name, len(context.new_states),
                                               len(states)))
    return (_finish_logits(model, logits, temperature, sampling_keep_top_k),
            context.new_states)
  return logits_fn


def _states_and_logits_fn(model, ids, variable_dtype, bos_id, model_kwargs,
                          temperature=None, sampling_keep_top_k=-1):
  """(initial states, logits_fn) for decoding ids: cached where the model supports it,
  else recomputing the prefix."""
  if _cached(model):
    states, constant_states = _prefill(model, ids, bos_id, variable_dtype, model_kwargs)
    return _loop_states(states), _incremental_logits_fn(
        model, variable_dtype, bos_id, model_kwargs, temperature, sampling_keep_top_k,
        constant_states)
  # Creates the model's variables outside the loop; the calls inside reuse them.
  model.call_simple(inputs=_decoder_inputs(ids, bos_id), targets=None, compute_loss=False,
                    mode=ModeKeys.PREDICT, variable_dtype=variable_dtype, **model_kwargs)
  return None, _logits_fn(model, variable_dtype, bos_id, model_kwargs, temperature,
                          sampling_keep_top_k)


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

  partial_sequences: int32 [batch..., length]; nonzero ids are a prompt, zeros are
  decoded. stop_at_token ends a sequence (0 after it) unless never_end. temperature: 0.0
  for argmax, else softmax(logits / temperature) sampling among the sampling_keep_top_k
  most likely ids (-1: all). encoder_*, shared_params: passed to the model (a
  Bitransformer's decoder). has_partial_sequences=False ignores the prompt;
  remove_partial_sequences zeroes it in the result. max_steps: at most this many
  positions decoded (None: to the end). bos_id: the input id read at the first
  position. Returns int32 shaped like partial_sequences.
  """
  _check_decoder(model, "sample_autoregressive")
  if not has_partial_sequences:
    partial_sequences = mtf.zeros_like(partial_sequences)
  kwargs = _model_kwargs(encoder_output, encoder_sequence_id, encoder_inputs,
                         shared_params, encoder_layer_outputs)
  states, logits_fn = _states_and_logits_fn(model, partial_sequences, variable_dtype,
                                            bos_id, kwargs, temperature,
                                            sampling_keep_top_k)
  ids = mtf_beam_search.greedy_decode(
      logits_fn, partial_sequences, temperature=temperature, initial_states=states,
      eos_id=-1 if never_end else stop_at_token, max_steps=max_steps)
  if remove_partial_sequences:
    ids *= mtf.cast(mtf.equal(partial_sequences, 0), tf.int32)
  return ids


def _with_beam(x, beam_dim, trailing_dims=2):
  """x broadcast with beam_dim before its last trailing_dims dims (None stays None)."""
  if x is None or beam_dim in x.shape.dims:
    return x
  dims = x.shape.dims
  return mtf.broadcast(x, dims[:-trailing_dims] + [beam_dim] + dims[-trailing_dims:])


def beam_search(model, inputs, decode_length,
                variable_dtype=mtf.VariableDType(tf.float32), encoder_output=None,
                encoder_sequence_id=None, encoder_inputs=None, alpha=0.6,
                shared_params=None, encoder_layer_outputs=None, bos_id=0):
  """Beam search with a Unitransformer; returns the best beam, [batch..., length].

  inputs: int32 [batch..., beam, length]: zeros, or a prompt (nonzero ids) to continue.
  decode_length: at most this many positions are decoded (int or scalar int Tensor).
  encoder_*, shared_params: passed to the model (broadcast over the beam dim). alpha:
  the length-penalty exponent. bos_id: the input id read at the first position.
  """
  _check_decoder(model, "beam_search")
  if inputs.shape.ndims < 2 or inputs.shape.dims[-2].name != BEAM_DIM_NAME:
    raise mtf.ShapeError(
        "beam_search: inputs %s %s must be [batch..., beam, length] with a dim named "
        "%r before the length" % (inputs.name, inputs.shape, BEAM_DIM_NAME),
        tensor=inputs.name, dim=BEAM_DIM_NAME)
  beam_dim = inputs.shape.dims[-2]
  encoder_output = _with_beam(encoder_output, beam_dim)
  encoder_sequence_id = _with_beam(encoder_sequence_id, beam_dim, trailing_dims=1)
  encoder_inputs = _with_beam(encoder_inputs, beam_dim, trailing_dims=1)
  kwargs = _model_kwargs(encoder_output, encoder_sequence_id, encoder_inputs,
                         shared_params, encoder_layer_outputs)
  beams, _ = beam_search_with_scores(model, inputs, decode_length, variable_dtype,
                                     alpha, kwargs, bos_id=bos_id)
  return mtf.gather(beams, mtf.constant(inputs.mesh, 0, dtype=tf.int32), beam_dim)


def beam_search_with_scores(model, inputs, decode_length, variable_dtype, alpha,
                            model_kwargs, bos_id=0):
  """mtf.beam_search over model's logits (cached where supported): (beams [batch...,
  beam, length], scores [batch..., beam]). model_kwargs: beam-broadcast decoder
  arguments (encoder_output, ...); bos_id: the input id read at the first position."""
  states, logits_fn = _states_and_logits_fn(model, inputs, variable_dtype, bos_id,
                                            model_kwargs)
  return mtf_beam_search.beam_search(logits_fn, inputs, alpha, states=states,
                                     decode_length=decode_length)


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
  """Encodes inputs [batch..., length] (0 = padding) once and decodes output ids
  [batch..., max_decode_length or length] with the decoder: greedy or sampled
  (beam_size 1, temperature, sampling_keep_top_k) or by beam search (alpha; at most
  decode_length_multiplier * (longest input) + decode_length_constant positions).
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
