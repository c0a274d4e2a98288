"""The Transformer models: `Unitransformer` (a decoder-only LM, or one half of an
encoder-decoder) and `Bitransformer` (encoder + decoder), with the target-shift helpers.
Variable names follow the original's ("transformer/embedding", "shared/embedding", ...).
"""
import math

import gin
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import model_layout
from models.transformer.context import Context, ModeKeys
from models.transformer.vocab_embeddings import get_vocab_embedding_cls

# Re-exported so `transformer.LayerStack`, `transformer.make_layer_stack`,
# `transformer.sublayer_*` and `transformer.VocabEmbedding` work as in the original.
from models.transformer.layer_stack import (  # pylint: disable=unused-import,g-multiple-import
    LayerStack, make_layer_stack, sublayer_annealed_dropout, sublayer_call_layer,
    sublayer_clip_activation_gradient, sublayer_dropout, sublayer_legacy_dropout,
    sublayer_legacy_final_rms_norm, sublayer_legacy_rms_norm, sublayer_mask_padding,
    sublayer_residual, sublayer_rezero, sublayer_rms_norm, sublayer_scale_norm,
    sublayer_true_layer_norm)
from models.transformer.vocab_embeddings import VocabEmbedding  # pylint: disable=unused-import
from models.transformer.layer_stack import sublayer_rms_norm_subsampled  # pylint: disable=unused-import
from models.transformer.reversible_layer_stack import ReversibleLayerStack  # pylint: disable=unused-import
from models.transformer.pipelined_layer_stack import PipelinedLayerStack  # pylint: disable=unused-import
from models.transformer.transformer_layer import TransformerLayer  # pylint: disable=unused-import
from models.transformer.ensemble_logits import (  # pylint: disable=unused-import,g-multiple-import
    reduce_ensemble_logits, reduce_ensemble_logits_mean_logit,
    reduce_ensemble_logits_mean_prob, reduce_ensemble_logits_select)
from models.transformer.student_teacher import StudentTeacher, make_bi_student_teacher  # pylint: disable=unused-import


def _vocab_dim(vocab_size, divisor):
  """The "vocab" dim of vocab_size rounded up to a multiple of divisor (None if no size)."""
  if not vocab_size:
    return None
  if divisor:
    vocab_size = (vocab_size + divisor - 1) // divisor * divisor
  return mtf.Dimension("vocab", vocab_size)


def _check_ids(tensor, what, model_name):
  """Raises ShapeError unless tensor is an integer mtf Tensor [batch..., length]."""
  if not isinstance(tensor, mtf.Tensor):
    raise mtf.ShapeError("%s %s: expected an mtf Tensor of int32 token ids, got %r" % (
        model_name, what, tensor), tensor=what)
  if not tensor.dtype.is_integer:
    raise mtf.ShapeError("%s %s: tensor %s %s must hold integer token ids, not %s" % (
        model_name, what, tensor.name, tensor.shape, tensor.dtype.name), tensor=tensor.name)
  if tensor.shape.ndims < 1:
    raise mtf.ShapeError("%s %s: tensor %s is a scalar; expected [batch..., length]" % (
        model_name, what, tensor.name), tensor=tensor.name)


def autoregressive_inputs(targets, sequence_id=None):
  """Targets shifted right by one along the length dim, 0 in front (and, with
  sequence_id, at the start of every packed segment)."""
  length_dim = targets.shape.dims[-1]
  inputs = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
  if sequence_id is not None:
    same = mtf.equal(sequence_id,
                     mtf.shift(sequence_id, offset=1, dim=length_dim, wrap=False))
    inputs *= mtf.cast(same, inputs.dtype)
  return inputs


def shift_targets(targets, bos_id=0, eos_id=1):
  """Targets shifted right by one, with bos_id at the start and after every eos_id."""
  length_dim = targets.shape.dims[-1]
  previous = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
  first = mtf.equal(mtf.range(targets.mesh, length_dim, tf.int32), 0)
  starts = mtf.logical_or(mtf.equal(previous, eos_id), first)
  bos = mtf.zeros_like(previous) + bos_id
  return mtf.where(starts, bos, previous)


def delimited_lm_inputs_mask(ids, eos_id=1):
  """True at the "inputs" part of a delimited-LM sequence: up to and including its
  first eos_id (per packed segment the caller handles segmentation)."""
  length_dim = ids.shape.dims[-1]
  eos_before = mtf.cumsum(mtf.cast(mtf.equal(ids, eos_id), tf.int32), length_dim,
                          exclusive=True)
  return mtf.equal(eos_before, 0)


def sinusoid_positional_embedding_weights(mesh, max_length_dim, model_dim, dtype,
                                          min_timescale=1.0, max_timescale=1.0e4):
  """Fixed [max_length, d_model] sinusoids: sin in the first half of d_model, cos in
  the second, with timescales geometric from min_timescale to max_timescale."""
  if model_dim.size % 2:
    raise mtf.ShapeError("sinusoid_positional_embedding_weights: d_model %s must be even"
                         % model_dim, dim=model_dim.name)
  half = model_dim.size // 2
  timescale_dim = mtf.Dimension(model_dim.name, half)
  increment = math.log(max_timescale / min_timescale) / max(half - 1, 1)
  inv_timescales = min_timescale * mtf.exp(
      mtf.range(mesh, timescale_dim, tf.float32) * -increment)
  scaled = mtf.range(mesh, max_length_dim, tf.float32) * inv_timescales
  signal = mtf.concat([mtf.sin(scaled), mtf.cos(scaled)], model_dim.name)
  return mtf.cast(signal, dtype)


@gin.configurable(module="transformer")
class Unitransformer:
  """A single Transformer stack: a language model, an encoder, or a decoder.

  Args (those of the original):
    input_vocab_size / output_vocab_size: None: the inputs are not token ids / the
      model returns hidden states.
    max_length: size of the positional-embedding table.
    shared_embedding_and_softmax_weights: the logits use the input embedding matrix.
    z_loss: coefficient of the log-partition penalty added in training.
    layout, mesh_shape: the layout rules and mesh shape the model is lowered with, kept
      as one MeshLayout `mesh_layout` (None unless both are given; layout may be a
      MeshLayout itself).
    vocab_divisor: the vocab dims are padded to a multiple of this.
    ensemble: number of independent models trained side by side (None: one).
    loss_fn: optional loss_fn(model, context, logits, targets, output_vocab_dim) giving
      the whole scalar loss instead.
    sinusoid_positional_embedding: add fixed sinusoids instead of a learned embedding.
    input_full_attention: the inputs part of a delimited LM attends in full.
    loss_on_targets_only: a delimited LM's loss skips its inputs part.
    loss_denominator: divide the summed loss by this (default targets.size).
    token_dropout_rate: in training, zero the embedding of a token with this rate.
  """

  def __init__(self, layer_stack, d_model=1024, input_vocab_size=None,
               output_vocab_size=None, autoregressive=False, max_length=512,
               shared_embedding_and_softmax_weights=False, label_smoothing=0.0,
               z_loss=1e-4, name="transformer", layout=None, mesh_shape=None,
               vocab_divisor=128, ensemble=None, loss_fn=None, positional_embedding=True,
               sinusoid_positional_embedding=False, input_full_attention=False,
               loss_on_targets_only=False, loss_denominator=None, token_dropout_rate=0.0):
    self.layer_stack = layer_stack
    self.model_dim = mtf.Dimension("d_model", d_model)
    self.input_vocab_size = input_vocab_size
    self.output_vocab_size = output_vocab_size
    self.input_vocab_dim = _vocab_dim(input_vocab_size, vocab_divisor)
    self.output_vocab_dim = _vocab_dim(output_vocab_size, vocab_divisor)
    if autoregressive and self.output_vocab_dim is None:
      raise mtf.MtfError("Unitransformer %r: an autoregressive model needs an "
                         "output_vocab_size" % name)
    self.autoregressive = autoregressive
    self.max_length_dim = mtf.Dimension("max_length", max_length) if max_length else None
    # An encoder has no softmax, so there is nothing to share (defaults.gin sets the
    # flag for every Unitransformer, as the original's did).
    if (shared_embedding_and_softmax_weights and self.output_vocab_dim is not None
        and self.input_vocab_dim != self.output_vocab_dim):
      raise mtf.MtfError(
          "Unitransformer %r: shared_embedding_and_softmax_weights needs equal padded "
          "input and output vocab dims, got %s and %s" % (
              name, self.input_vocab_dim, self.output_vocab_dim))
    self.shared_embedding_and_softmax_weights = shared_embedding_and_softmax_weights
    self.label_smoothing = label_smoothing
    self.z_loss = z_loss
    self._name = name
    self.mesh_layout = model_layout.mesh_layout_of(layout, mesh_shape)
    self.ensemble_dim = mtf.Dimension("ensemble", ensemble) if ensemble else None
    self.loss_fn = loss_fn
    self.positional_embedding = positional_embedding
    self.sinusoid_positional_embedding = sinusoid_positional_embedding
    self.input_full_attention = input_full_attention
    self.loss_on_targets_only = loss_on_targets_only
    self._loss_denominator = loss_denominator
    self.token_dropout_rate = token_dropout_rate
    self._built = False

  @property
  def layout(self):
    """The layout rules (a view of mesh_layout; None without one)."""
    return self.mesh_layout.layout_rules if self.mesh_layout is not None else None

  @property
  def mesh_shape(self):
    """The mesh shape (a view of mesh_layout; None without one)."""
    return self.mesh_layout.shape if self.mesh_layout is not None else None

  @property
  def name(self):
    """The variable scope of the model ("transformer", "encoder", "decoder", ...)."""
    return self._name

  @property
  def ensemble_dims(self):
    """[ensemble_dim] when training an ensemble, else []."""
    return [self.ensemble_dim] if self.ensemble_dim else []

  @property
  def fully_autoregressive(self):
    """Autoregressive everywhere (no fully-attended inputs region)."""
    return self.autoregressive and not self.input_full_attention

  def loss_denominator(self, targets, num_microbatches):
    """What the summed token losses are divided by: the constructor's loss_denominator,
    else targets.shape.size * num_microbatches (per ensemble member)."""
    if self._loss_denominator is not None:
      return float(self._loss_denominator)
    ret = float(targets.shape.size) * num_microbatches
    if self.ensemble_dim and self.ensemble_dim in targets.shape.dims:
      ret /= self.ensemble_dim.size
    return float(ret)

  def _priorities(self, targets, length_dim, length_range):
    """(read_priority, write_priority): who may attend to whom."""
    if self.input_full_attention:
      region = delimited_lm_inputs_mask(targets)
      # The position reading the inputs' final EOS (which predicts the first target
      # token) is part of the fully attended region too.
      region = mtf.logical_or(region, mtf.shift(region, offset=1, dim=length_dim,
                                                wrap=False))
      priority = length_range * mtf.cast(mtf.logical_not(region), tf.int32)
      return priority, priority
    if self.autoregressive:
      return length_range, length_range
    return None, None

  def call_simple(self, inputs, targets, compute_loss, mode=ModeKeys.TRAIN,
                  variable_dtype=mtf.VariableDType(tf.float32), sequence_id=None,
                  subsequence_id=None, position=None, encoder_output=None,
                  encoder_sequence_id=None, encoder_inputs=None, shared_params=None,
                  layer_outputs=None, encoder_layer_outputs=None, num_microbatches=1):
    """Runs the model on all positions of inputs [batch..., length] at once; returns
    (logits [batch..., length, vocab], loss scalar or None).

    sequence_id, subsequence_id, position: packing information (None: one example per
    row). encoder_*: for a decoder. shared_params: weights shared with another model
    ("embedding", "positional_embedding"). layer_outputs, encoder_layer_outputs: lists
    collecting per-layer outputs. num_microbatches scales the loss.
    """
    logits, losses = self.call_with_losses(
        inputs, targets, compute_loss, mode=mode, variable_dtype=variable_dtype,
        sequence_id=sequence_id, subsequence_id=subsequence_id, position=position,
        encoder_output=encoder_output, encoder_sequence_id=encoder_sequence_id,
        encoder_inputs=encoder_inputs, shared_params=shared_params,
        layer_outputs=layer_outputs, encoder_layer_outputs=encoder_layer_outputs,
        num_microbatches=num_microbatches)
    if not compute_loss or targets is None or not losses:
      return logits, None
    return logits, mtf.add_n(losses)

  def call_with_losses(self, inputs, targets, compute_loss, mode=ModeKeys.TRAIN,
                       variable_dtype=mtf.VariableDType(tf.float32), sequence_id=None,
                       subsequence_id=None, position=None, shared_params=None,
                       num_microbatches=1, **kwargs):
    """Like call_simple, but returns (output, list of losses): the token loss (when
    targets are given) and the layers' auxiliary losses (e.g. MoE), which an encoder
    called without targets still produces."""
    _check_ids(inputs, "inputs", "Unitransformer %r" % self.name)
    if targets is not None:
      _check_ids(targets, "targets", "Unitransformer %r" % self.name)
      if targets.shape != inputs.shape:
        raise mtf.ShapeError("Unitransformer %r: targets %s %s and inputs %s %s must have "
                             "the same shape" % (self.name, targets.name, targets.shape,
                                                 inputs.name, inputs.shape),
                             tensor=targets.name)
    batch_dims = inputs.shape.dims[:-1]
    length_dim = inputs.shape.dims[-1]
    length_range = mtf.range(inputs.mesh, length_dim, tf.int32)
    if not self.positional_embedding:
      # Relative attention assumes positions equal tensor indices; it still computes
      # correct relative offsets within each packed segment.
      position = None
    position_is_default = position is None
    if position_is_default:
      position = length_range
    read_priority, write_priority = self._priorities(targets, length_dim, length_range)
    context = Context(
        model=self, mesh=inputs.mesh, batch_dims=batch_dims, length_dim=length_dim,
        variable_dtype=variable_dtype, mode=mode,
        losses=[] if compute_loss else None, sequence_id=sequence_id,
        subsequence_id=subsequence_id, position=position,
        position_is_default=position_is_default, write_priority=write_priority,
        read_priority=read_priority, inputs=inputs, num_microbatches=num_microbatches,
        shared_params=shared_params or {}, **kwargs)
    with mtf.variable_scope(self.name, reuse=self._built or None):
      output = self._call_internal(context, inputs, targets)
    self._built = True
    return output, context.losses

  def _embed(self, context, inputs):
    """Token embeddings plus positional embeddings."""
    mesh = inputs.mesh
    if "embedding" in context.shared_params:
      vocab_embedding = context.shared_params["embedding"]
    else:
      vocab_embedding = get_vocab_embedding_cls()(
          mesh, self.input_vocab_dim, self.model_dim, context.variable_dtype,
          name="embedding", ensemble_dim=self.ensemble_dim)
    x = vocab_embedding.ids_to_embedding(inputs, context)
    if self.token_dropout_rate and context.train:
      x *= mtf.cast(mtf.greater_equal(
          mtf.random_uniform(mesh, inputs.shape, dtype=x.dtype), self.token_dropout_rate),
                    x.dtype)
    if self.positional_embedding or self.sinusoid_positional_embedding:
      x += self._positional_embedding(context, x)
    return x, vocab_embedding

  def _positional_embedding(self, context, x):
    mesh = x.mesh
    length_dim = context.length_dim
    if length_dim is not None and (self.max_length_dim is None
                                   or length_dim.size > self.max_length_dim.size):
      if context.position_is_default:
        raise mtf.ShapeError(
            "Unitransformer %r: length dim %s of the inputs exceeds max_length %s (the "
            "positional embedding table); raise max_length or shorten the sequences"
            % (self.name, length_dim, self.max_length_dim), dim=length_dim.name)
    if self.sinusoid_positional_embedding:
      table = sinusoid_positional_embedding_weights(
          mesh, self.max_length_dim, self.model_dim, context.activation_dtype)
    elif "positional_embedding" in context.shared_params:
      table = context.shared_params["positional_embedding"]
    else:
      table = mtf.layers.embedding_weights(
          mesh, self.max_length_dim, self.model_dim, context.variable_dtype,
          "positional_embedding", ensemble_dim=self.ensemble_dim)
    if context.incremental:  # one position: the scalar context.position
      return mtf.gather(table, context.position, self.max_length_dim)
    if context.position_is_default:
      sliced = mtf.slice(table, 0, length_dim.size, self.max_length_dim.name)
      return mtf.rename_dimension(sliced, self.max_length_dim.name, length_dim.name)
    return mtf.gather(table, context.position, self.max_length_dim, output_shape=x.shape)

  def _call_internal(self, context, inputs, targets=None):
    if self.ensemble_dim and self.ensemble_dim not in inputs.shape.dims:
      inputs = mtf.broadcast(inputs, [self.ensemble_dim] + inputs.shape.dims)
      if targets is not None:
        targets = mtf.broadcast(targets, [self.ensemble_dim] + targets.shape.dims)
    x, vocab_embedding = self._embed(context, inputs)
    context.input_embeddings = x  # read by MoE1D(word_embed_mode=...)
    x = self.layer_stack.call(context, x)
    if self.output_vocab_dim is None:
      return x
    if self.shared_embedding_and_softmax_weights:
      logits = vocab_embedding.hidden_to_logits(x, context)
    else:
      logits = mtf.layers.dense(x, self.output_vocab_dim, use_bias=False,
                                variable_dtype=context.variable_dtype,
                                reduced_dims=x.shape.dims[-1:], name="logits")
    if targets is not None and context.losses is not None:
      context.losses.append(self._compute_loss(context, logits, targets))
    return logits

  def _compute_loss(self, context, logits, targets):
    """Summed (label-smoothed, z-regularized in training) token xent / denominator."""
    vocab_dim = self.output_vocab_dim
    if self.loss_fn:
      return self.loss_fn(self, context, logits, targets, vocab_dim)
    off_value = self.label_smoothing / vocab_dim.size
    on_value = 1.0 - self.label_smoothing + off_value
    soft_targets = mtf.one_hot(targets, vocab_dim, on_value=on_value,
                               off_value=off_value, dtype=context.activation_dtype)
    loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, soft_targets, vocab_dim, z_loss=self.z_loss if context.train else 0.0)
    weights = mtf.layers.weights_nonzero(targets, dtype=context.activation_dtype)
    if self.loss_on_targets_only:
      weights *= mtf.cast(mtf.logical_not(delimited_lm_inputs_mask(targets)),
                          context.activation_dtype)
    return (mtf.reduce_sum(loss * weights)
            / self.loss_denominator(targets, context.num_microbatches))

  @gin.configurable(module="Unitransformer")
  def sample_autoregressive(self, partial_sequences, stop_at_token=1, max_steps=None,
                            temperature=0.0, variable_dtype=mtf.VariableDType(tf.float32),
                            encoder_output=None, encoder_sequence_id=None,
                            encoder_inputs=None, shared_params=None,
                            has_partial_sequences=True, encoder_layer_outputs=None,
                            never_end=False, remove_partial_sequences=False,
                            sampling_keep_top_k=-1, bos_id=0):
    """Samples continuations (greedy at temperature 0); see decoding.sample_autoregressive."""
    from models.transformer import decoding  # pylint: disable=g-import-not-at-top
    return decoding.sample_autoregressive(
        self, partial_sequences, stop_at_token=stop_at_token, max_steps=max_steps,
        temperature=temperature, variable_dtype=variable_dtype,
        encoder_output=encoder_output, encoder_sequence_id=encoder_sequence_id,
        encoder_inputs=encoder_inputs, shared_params=shared_params,
        has_partial_sequences=has_partial_sequences,
        encoder_layer_outputs=encoder_layer_outputs, never_end=never_end,
        remove_partial_sequences=remove_partial_sequences,
        sampling_keep_top_k=sampling_keep_top_k, bos_id=bos_id)

  @gin.configurable(module="Unitransformer")
  def beam_search(self, inputs, decode_length, variable_dtype=mtf.VariableDType(tf.float32),
                  encoder_output=None, encoder_sequence_id=None, encoder_inputs=None,
                  alpha=0.6, shared_params=None, encoder_layer_outputs=None, bos_id=0):
    """Beam-search decoding; see decoding.beam_search."""
    from models.transformer import decoding  # pylint: disable=g-import-not-at-top
    return decoding.beam_search(
        self, inputs, decode_length, variable_dtype=variable_dtype,
        encoder_output=encoder_output, encoder_sequence_id=encoder_sequence_id,
        encoder_inputs=encoder_inputs, alpha=alpha, shared_params=shared_params,
        encoder_layer_outputs=encoder_layer_outputs, bos_id=bos_id)


@gin.configurable(module="transformer")
class Bitransformer:
  """An encoder-decoder: two Unitransformers, with shared_embedding both using
  "shared/embedding" (and "shared/positional_embedding" when their max lengths agree).
  """

  def __init__(self, encoder, decoder, shared_embedding=True):
    self.encoder = encoder
    self.decoder = decoder
    self.shared_embedding = shared_embedding
    self._built = False

  @property
  def output_vocab_dim(self):
    """The decoder's (padded) output vocab dim."""
    return self.decoder.output_vocab_dim

  @property
  def z_loss(self):
    """The decoder's z_loss coefficient."""
    return self.decoder.z_loss

  def loss_denominator(self, targets, num_microbatches):
    """The decoder's loss denominator."""
    return self.decoder.loss_denominator(targets, num_microbatches)

  def _shared_params(self, mesh, variable_dtype):
    if not self.shared_embedding:
      return {}  # each model then owns "<name>/embedding"
    encoder, decoder = self.encoder, self.decoder
    if (encoder.model_dim != decoder.model_dim
        or encoder.input_vocab_dim != decoder.input_vocab_dim):
      raise mtf.ShapeError(
          "Bitransformer: shared_embedding needs equal d_model and input vocab dims, got "
          "encoder %s/%s and decoder %s/%s" % (encoder.model_dim, encoder.input_vocab_dim,
                                               decoder.model_dim, decoder.input_vocab_dim))
    params = {}
    with mtf.variable_scope("shared", reuse=self._built or None):
      params["embedding"] = get_vocab_embedding_cls()(
          mesh, encoder.input_vocab_dim, encoder.model_dim, variable_dtype,
          name="embedding", ensemble_dim=encoder.ensemble_dim)
      if (encoder.positional_embedding and decoder.positional_embedding
          and not encoder.sinusoid_positional_embedding
          and not decoder.sinusoid_positional_embedding
          and encoder.max_length_dim == decoder.max_length_dim):
        params["positional_embedding"] = mtf.layers.embedding_weights(
            mesh, encoder.max_length_dim, encoder.model_dim, variable_dtype,
            "positional_embedding", ensemble_dim=encoder.ensemble_dim)
    return params

  def encode(self, inputs, compute_loss=False, mode=ModeKeys.PREDICT,
             variable_dtype=mtf.VariableDType(tf.float32), encoder_sequence_id=None,
             encoder_position=None, num_microbatches=1):
    """Runs the encoder on inputs; returns (decoder_kwargs, encoder_losses), the kwargs
    those of the decoder's call_simple (encoder_*, length renamed memory_length, and
    shared_params). Without encoder_sequence_id, padding (id 0) gets sequence id 0.
    """
    _check_ids(inputs, "inputs", "Bitransformer")
    if encoder_sequence_id is None:
      encoder_sequence_id = mtf.minimum(inputs, 1)
    shared_params = self._shared_params(inputs.mesh, variable_dtype)
    self._built = True
    encoder_layer_outputs = []
    encoder_output, encoder_losses = self.encoder.call_with_losses(
        inputs, None, compute_loss, mode=mode, variable_dtype=variable_dtype,
        sequence_id=encoder_sequence_id, position=encoder_position,
        shared_params=shared_params, layer_outputs=encoder_layer_outputs,
        num_microbatches=num_microbatches)
    rename = mtf.layers.rename_length_to_memory_length
    return dict(encoder_output=rename(encoder_output),
                encoder_sequence_id=rename(encoder_sequence_id),
                encoder_inputs=rename(inputs), shared_params=shared_params,
                encoder_layer_outputs=encoder_layer_outputs), encoder_losses

  def call_simple(self, inputs, targets, compute_loss, mode=ModeKeys.TRAIN,
                  variable_dtype=mtf.VariableDType(tf.float32), encoder_sequence_id=None,
                  decoder_sequence_id=None, decoder_subsequence_id=None,
                  encoder_position=None, decoder_position=None, num_microbatches=1):
    """Encodes inputs, decodes targets (teacher-forced); returns (logits, loss)."""
    _check_ids(targets, "targets", "Bitransformer")
    encoded, encoder_losses = self.encode(
        inputs, compute_loss, mode=mode, variable_dtype=variable_dtype,
        encoder_sequence_id=encoder_sequence_id, encoder_position=encoder_position,
        num_microbatches=num_microbatches)
    logits, loss = self.decoder.call_simple(
        autoregressive_inputs(targets, sequence_id=decoder_sequence_id), targets,
        compute_loss, mode=mode, variable_dtype=variable_dtype,
        sequence_id=decoder_sequence_id, subsequence_id=decoder_subsequence_id,
        position=decoder_position, num_microbatches=num_microbatches, **encoded)
    if loss is not None and encoder_losses:
      loss = mtf.add_n([loss] + list(encoder_losses))
    return logits, loss

  @gin.configurable(module="Bitransformer")
  def decode(self, inputs, variable_dtype=mtf.VariableDType(tf.float32), beam_size=1,
             alpha=0.6, temperature=0.0, sampling_keep_top_k=-1,
             decode_length_multiplier=1.5, decode_length_constant=10,
             max_decode_length=None):
    """Decodes outputs for inputs; see decoding.bitransformer_decode."""
    from models.transformer import decoding  # pylint: disable=g-import-not-at-top
    return decoding.bitransformer_decode(
        self, inputs, variable_dtype=variable_dtype, beam_size=beam_size, alpha=alpha,
        temperature=temperature, sampling_keep_top_k=sampling_keep_top_k,
        decode_length_multiplier=decode_length_multiplier,
        decode_length_constant=decode_length_constant,
        max_decode_length=max_decode_length)


def _gin_bound(key):
  try:
    gin.query_parameter(key)
    return True
  except ValueError:
    return False


def _stack_for(scope, default_layers):
  """make_layer_stack() under a gin config scope, with default layers if gin binds none."""
  key = "transformer.make_layer_stack.layers"
  with gin.config_scope(scope):
    if _gin_bound("%s/%s" % (scope, key)) or _gin_bound(key):
      return make_layer_stack()
    return make_layer_stack(layers=default_layers)


@gin.configurable(module="transformer")
def make_bitransformer(input_vocab_size=gin.REQUIRED, output_vocab_size=gin.REQUIRED,
                       layout=None, mesh_shape=None, encoder_name="encoder",
                       decoder_name="decoder", bitransformer_cls=Bitransformer):
  """A Bitransformer configured under the gin scopes "encoder" and "decoder" (e.g.
  `decoder/make_layer_stack.layers = [...]`; default layers [SelfAttention,
  (EncDecAttention,) DenseReluDense])."""
  from models.transformer import transformer_layers  # pylint: disable=g-import-not-at-top
  encoder_stack = _stack_for("encoder", [transformer_layers.SelfAttention,
                                         transformer_layers.DenseReluDense])
  with gin.config_scope("encoder"):
    encoder = Unitransformer(layer_stack=encoder_stack, input_vocab_size=input_vocab_size,
                             output_vocab_size=None, autoregressive=False,
                             name=encoder_name, layout=layout, mesh_shape=mesh_shape)
  decoder_stack = _stack_for("decoder", [transformer_layers.SelfAttention,
                                         transformer_layers.EncDecAttention,
                                         transformer_layers.DenseReluDense])
  with gin.config_scope("decoder"):
    decoder = Unitransformer(layer_stack=decoder_stack, input_vocab_size=output_vocab_size,
                             output_vocab_size=output_vocab_size, autoregressive=True,
                             name=decoder_name, layout=layout, mesh_shape=mesh_shape)
  return bitransformer_cls(encoder, decoder)
