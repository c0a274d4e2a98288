"""Research variants of Transformer attention, with the original's names and variables:
talking-heads (arXiv 2003.02436), general bilinear, transparent (Bapna et al. 2018),
branched (the Weighted Transformer, Ahmed et al. 2017) and Synthesizer (Tay et al. 2020)
attention, offered (and gin-configurable) as transformer_layers.<Name>."""
import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import MtfError, ShapeError
from models.transformer import attention
from models.transformer import core_layers as tl
from models.transformer.context import incremental_aware


def _ensemble_dims(context):
  return list(getattr(context.model, "ensemble_dims", None) or [])


def _dims(dims):
  """Dimensions from Dimensions or (name, size) pairs."""
  return [mtf.convert_to_dimension(d) for d in dims]


def _check_relative_attention_type(layer, relative_attention_type):
  """These layers have no d_kv queries, so no "contextual" relative attention."""
  known = (None, "bias", "bias_shared")
  if relative_attention_type not in known:
    raise MtfError("%s: relative_attention_type %r is not one of %s" % (
        type(layer).__name__, relative_attention_type, known),
                   rule=str(relative_attention_type))


def _dropout(context, weights, rate):
  """Dropout on attention weights in training, one mask along the length dim."""
  if not (context.train and rate):
    return weights
  return mtf.dropout(weights, rate=rate,
                     noise_shape=weights.shape - [d for d in [context.length_dim] if d])


def _query_scale_initializer(size):
  """Variance 1/size (the logits' 1/sqrt(d_k) folded into the query projection)."""
  scale = 1.0
  if not mtf.layers.unit_scaling_convention():
    scale /= size
  return mtf.layers.VarianceScalingInitializer(scale)


def _dense_keeping_name(x, reduced_dims, new_dims, context, name, initializer=None):
  """A bias-free dense layer; a reduced dim whose name an output dim reuses is renamed
  "_<name>" first, as in the original (kernel [_d_model, ..., d_model])."""
  new_names = {d.name for d in new_dims}
  renamed = []
  for d in reduced_dims:
    if d.name in new_names:
      x = mtf.rename_dimension(x, d.name, "_" + d.name)
      d = mtf.Dimension("_" + d.name, d.size)
    renamed.append(d)
  return mtf.layers.dense(x, new_dims, reduced_dims=renamed, use_bias=False,
                          variable_dtype=context.variable_dtype, name=name,
                          expert_dims=_ensemble_dims(context),
                          kernel_initializer=initializer)


class _AttentionWithOwnProjections(tl.SelfAttention):
  """Base of the variants below: call computes q (compute_q) and the memory m, x with
  "memory_length"; _attend_memory caches what decoding needs and attends."""

  @property
  def supports_incremental_decoding(self):
    """Cached decoding keeps the memory tensors _attend_memory caches."""
    return True

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] -> the same shape."""
    del losses
    with tl.class_scope(self):
      q = self.compute_q(context, x)
      m = self.rename_length_to_memory_length(x, context)
      return self._attend_memory(context, x, q, m)


class _EncoderMemoryAttention:
  """Mixin making a self-attention variant attend to the encoder output."""

  def __init__(self, relative_attention_type=None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  @property
  def supports_incremental_decoding(self):
    """Cached decoding reads the encoder's memory computed once; the relative-position
    spans of a relative_attention_type need the whole target sequence."""
    return self.relative_attention_type is None


@gin.configurable(module="transformer_layers")
class TalkingHeadsSelfAttention(_AttentionWithOwnProjections):
  """Talking-heads self-attention: learned projections across heads on the logits
  (key heads -> softmax heads) and on the weights (softmax heads -> value heads).

  Variables: q/kernel [d_model, key_heads..., d_k], k/kernel, v/kernel [d_model,
  value_heads..., d_v], y/kernel [value_heads..., d_v, d_model], and where the heads
  dims differ logits/kernel and weights/kernel. dynamic_projections, a subset of
  ["x2l", "m2l", "x2w", "m2w"], adds projections computed from the query input (x) or
  the memory (m) to the logits (l) or weights (w) projections ("logits/kernel" plus
  "logits/logits_dynamic_<i>/kernel"). Heads dims are Dimensions or (name, size) pairs.
  """

  def __init__(self, key_heads_dims=(("heads", 12),), softmax_heads_dims=(("heads", 12),),
               value_heads_dims=(("heads", 12),), key_size=64, value_size=64,
               dropout_rate=0.0, relative_attention_type=None,
               relative_attention_num_buckets=32, dynamic_projections=None,
               dynamic_projections_init_scale=1e-2):
    # pylint: disable=super-init-not-called
    _check_relative_attention_type(self, relative_attention_type)
    unknown = set(dynamic_projections or []) - {"x2l", "m2l", "x2w", "m2w"}
    if unknown:
      raise MtfError("%s: unknown dynamic_projections %s (known: x2l, m2l, x2w, m2w)" % (
          type(self).__name__, sorted(unknown)), rule=str(sorted(unknown)))
    self.key_heads_dims = _dims(key_heads_dims)
    self.softmax_heads_dims = _dims(softmax_heads_dims)
    self.value_heads_dims = _dims(value_heads_dims)
    self.key_dim = mtf.Dimension("d_k", key_size)
    self.value_dim = mtf.Dimension("d_v", value_size)
    self.dropout_rate = dropout_rate
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = relative_attention_num_buckets
    self.dynamic_projections = list(dynamic_projections or [])
    self.dynamic_projections_init_scale = dynamic_projections_init_scale

  def compute_q(self, context, x):
    """Queries [..., key_heads..., d_k] (variance 1/d_k folded into "q")."""
    return _dense_keeping_name(x, x.shape.dims[-1:], self.key_heads_dims + [self.key_dim],
                               context, "q", _query_scale_initializer(self.key_dim.size))

  def compute_k(self, context, x):
    """Keys [..., key_heads..., d_k] from the memory."""
    return _dense_keeping_name(x, x.shape.dims[-1:], self.key_heads_dims + [self.key_dim],
                               context, "k")

  def compute_v(self, context, x):
    """Values [..., value_heads..., d_v] from the memory."""
    return _dense_keeping_name(x, x.shape.dims[-1:],
                               self.value_heads_dims + [self.value_dim], context, "v")

  def compute_y(self, context, u):
    """The output projection "y": value heads and d_v -> d_model."""
    return _dense_keeping_name(u, self.value_heads_dims + [self.value_dim],
                               [tl._model_dim(context)], context, "y")  # pylint: disable=protected-access

  def _attend_memory(self, context, x, q, m):
    """Caches the keys and values (and m, for the "m2l" and "m2w" projections)."""
    k, v = self.compute_k(context, m), self.compute_v(context, m)
    if {"m2l", "m2w"} & set(self.dynamic_projections):
      (k, v, m), memory_length, memory_position = tl.memory_through_caches(
          self, context, [k, v, m])
    else:
      (k, v), memory_length, memory_position = tl.memory_through_caches(
          self, context, [k, v])
    bias = self.compute_bias(context, memory_position, x, self.softmax_heads_dims, q)
    return self.attention_internal(context, x, m, q, k, v, memory_length, bias)

  def attention_internal(self, context, x, m, q, k, v, memory_length, bias):
    """Logits q.k, talking-heads projection, softmax over memory_length, projection,
    dropout, weighted sum of v, output projection."""
    logits = mtf.layers.us_einsum([q, k], reduced_dims=[self.key_dim])
    logits = self.talking_heads(
        context, logits, "logits", self.key_heads_dims, self.softmax_heads_dims,
        dynamic_projections_from=(([x] if "x2l" in self.dynamic_projections else []) +
                                  ([m] if "m2l" in self.dynamic_projections else [])))
    if bias is not None:
      logits += mtf.cast(bias, logits.dtype)
    h = mtf.softmax(logits, memory_length)
    weights = self.talking_heads(
        context, h, "weights", self.softmax_heads_dims, self.value_heads_dims,
        dynamic_projections_from=(([x] if "x2w" in self.dynamic_projections else []) +
                                  ([m] if "m2w" in self.dynamic_projections else [])))
    weights = _dropout(context, weights, self.dropout_rate)
    u = mtf.einsum([weights, v], reduced_dims=[memory_length])
    return self.compute_y(context, u)

  def talking_heads(self, context, inp, name, input_heads_dims, output_heads_dims,
                    dynamic_projections_from=None):
    """inp projected from input_heads_dims to output_heads_dims (dims in both are kept,
    projected separately); inp itself when the dims are the same. With
    dynamic_projections_from (tensors with d_model), "<name>/kernel" is added to the
    projection computed from the first, and each further one's projection is added."""
    shared = [d for d in input_heads_dims if d in output_heads_dims]
    reduced = [d for d in input_heads_dims if d not in output_heads_dims]
    new = [d for d in output_heads_dims if d not in input_heads_dims]
    if not (reduced or new):
      return inp
    if not dynamic_projections_from:
      return mtf.layers.dense(inp, new, reduced_dims=reduced, use_bias=False,
                              variable_dtype=context.variable_dtype, name=name,
                              expert_dims=_ensemble_dims(context) + shared)
    model_dim = tl._model_dim(context)  # pylint: disable=protected-access
    scale = self.dynamic_projections_init_scale
    if not mtf.layers.unit_scaling_convention():
      scale /= mtf.Shape(reduced).size
    with mtf.variable_scope(name):
      static = mtf.get_variable(
          inp.mesh, "kernel", mtf.Shape(_ensemble_dims(context) + shared + reduced + new),
          initializer=mtf.layers.VarianceScalingInitializer()(reduced, new),
          dtype=context.variable_dtype)
      projections = [
          mtf.layers.dense(source, shared + reduced + new, reduced_dims=[model_dim],
                           use_bias=False, variable_dtype=context.variable_dtype,
                           name="%s_dynamic_%d" % (name, i),
                           expert_dims=_ensemble_dims(context),
                           kernel_initializer=mtf.layers.VarianceScalingInitializer(scale))
          for i, source in enumerate(dynamic_projections_from)]
    projections[0] += mtf.cast(static, projections[0].dtype)
    return mtf.add_n([mtf.layers.us_einsum([inp, p], reduced_dims=reduced)
                      for p in projections])


def _encoder_memory(layer, context):
  """The encoder output with its length dim called "memory_length"."""
  memory = tl.EncDecAttention._get_memory_antecedent(layer, context)  # pylint: disable=protected-access
  return tl._as_memory(memory, type(layer).__name__)  # pylint: disable=protected-access


def _encoder_constant_states(context, compute):
  """compute() (tensors of the encoder output), recorded as a constant state in
  "first_part" mode and read back in "incremental" mode."""
  if context.constant_states is not None and context.incremental:
    return context.get_constant_state()
  states = compute()
  if context.constant_states is not None and context.mode == "first_part":
    context.record_constant_state(states)
  return states


@gin.configurable(module="transformer_layers")
class TalkingHeadsEncDecAttention(_EncoderMemoryAttention, TalkingHeadsSelfAttention):
  """Talking-heads attention over the encoder output (masking and relative biases as
  in enc_dec_attention_bias)."""

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] attends to the encoder output; returns x's shape
    (in decoding the encoder's keys and values are computed once, in first_part mode)."""
    del losses
    m = _encoder_memory(self, context)
    memory_length = m.shape.get_dim_by_name("memory_length")
    with tl.class_scope(self):
      q = self.compute_q(context, x)
      k, v = _encoder_constant_states(
          context, lambda: (self.compute_k(context, m), self.compute_v(context, m)))
      bias = tl.enc_dec_attention_bias(self, context, self.softmax_heads_dims)
      return self.attention_internal(context, x, m, q, k, v, memory_length, bias)


@gin.configurable(module="transformer_layers")
class GeneralBilinearSelfAttention(_AttentionWithOwnProjections):
  """Multi-head attention with d_k = d_v = d_model and no key, value projections:
  logits q.m with q = x "q" [d_model, heads..., d_model], output "y" [heads...,
  d_model, d_model] applied to the weighted sum of the memory m."""

  def __init__(self, heads_dims=(("heads", 12),), dropout_rate=0.0,
               relative_attention_type=None, relative_attention_num_buckets=32):
    # pylint: disable=super-init-not-called
    _check_relative_attention_type(self, relative_attention_type)
    self.heads_dims = _dims(heads_dims)
    self.dropout_rate = dropout_rate
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = relative_attention_num_buckets

  def compute_q(self, context, x):
    """[..., d_model] -> [..., heads..., d_model] (variance 1/d_model folded in)."""
    model_dim = x.shape.dims[-1]
    return _dense_keeping_name(x, [model_dim], self.heads_dims + [model_dim], context, "q",
                               _query_scale_initializer(model_dim.size))

  def compute_y(self, context, u):
    """[..., heads..., d_model] -> [..., d_model]."""
    model_dim = u.shape.dims[-1]
    return _dense_keeping_name(u, self.heads_dims + [model_dim], [model_dim], context, "y")

  def _attend_memory(self, context, x, q, m):
    """Caches the memory (the layer inputs)."""
    (m,), memory_length, memory_position = tl.memory_through_caches(self, context, [m])
    bias = self.compute_bias(context, memory_position, x, self.heads_dims, q)
    return self.attention_internal(context, q, m, memory_length, bias)

  def attention_internal(self, context, q, m, memory_length, bias):
    """softmax(q.m + bias) over memory_length, dropout, times m, then "y"."""
    model_dim = m.shape.dims[-1]
    if model_dim not in q.shape.dims:
      raise ShapeError("%s: query %s and memory %s do not share the model dim %s" % (
          type(self).__name__, q.shape, m.shape, model_dim), tensor=q.name,
                       dim=model_dim.name)
    logits = mtf.layers.us_einsum([q, m], reduced_dims=[model_dim])
    if bias is not None:
      logits += mtf.cast(bias, logits.dtype)
    weights = _dropout(context, mtf.softmax(logits, memory_length), self.dropout_rate)
    u = mtf.einsum([weights, m], reduced_dims=[memory_length])
    return self.compute_y(context, u)


@gin.configurable(module="transformer_layers")
class GeneralBilinearEncDecAttention(_EncoderMemoryAttention, GeneralBilinearSelfAttention):
  """General bilinear attention over the encoder output."""

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] attends to the encoder output; returns x's shape
    (the memory is the encoder output itself, so decoding needs no cache)."""
    del losses
    m = _encoder_memory(self, context)
    with tl.class_scope(self):
      q = self.compute_q(context, x)
      bias = tl.enc_dec_attention_bias(self, context, self.heads_dims)
      return self.attention_internal(context, q, m, m.shape.get_dim_by_name("memory_length"),
                                     bias)


@gin.configurable(module="transformer_layers")
class TransparentEncDecAttention(tl.EncDecAttention):
  """Encoder-decoder attention to a learned mix of the encoder's layer outputs.

  Every layers_per_encoder_module-th of context.encoder_layer_outputs (encoder_num_modules
  + 1 of them) is mixed by a learned "w" [encoder_module_outputs, decoder_module_inputs]
  (dropout in training, softmax over the encoder outputs) into one memory per decoder
  module; the layer at context.layer_index attends to that of module layer_index //
  layers_per_decoder_module. The first such layer holds "w" and computes the mixes.
  """

  def __init__(self, layers_per_encoder_module=gin.REQUIRED,
               layers_per_decoder_module=gin.REQUIRED, encoder_num_modules=gin.REQUIRED,
               decoder_num_modules=gin.REQUIRED, dropout_rate=0.0, **kwargs):
    super().__init__(**kwargs)
    self.layers_per_encoder_module = layers_per_encoder_module
    self.layers_per_decoder_module = layers_per_decoder_module
    self.encoder_num_modules = encoder_num_modules
    self.decoder_num_modules = decoder_num_modules
    self.dropout_rate = dropout_rate

  def _get_decoder_inputs(self, context):
    """The decoder modules' memories (cached on the context)."""
    cached = getattr(context, "decoder_layers_per_module", None)
    if cached is not None:
      return cached
    outputs = context.encoder_layer_outputs
    needed = self.layers_per_encoder_module * self.encoder_num_modules + 1
    if not outputs or len(outputs) < needed:
      raise MtfError("%s: needs context.encoder_layer_outputs with at least %d entries "
                     "(%d modules of %d layers), got %d" % (
                         type(self).__name__, needed, self.encoder_num_modules,
                         self.layers_per_encoder_module, len(outputs or [])))
    outputs = [tl._as_memory(o, type(self).__name__) for o in outputs]  # pylint: disable=protected-access
    per = self.layers_per_encoder_module
    encoder_dim = mtf.Dimension("encoder_module_outputs", self.encoder_num_modules + 1)
    decoder_dim = mtf.Dimension("decoder_module_inputs", self.decoder_num_modules)
    stacked = mtf.stack([outputs[0]] + outputs[per:needed:per], encoder_dim.name)
    stddev = 1.0
    if not mtf.layers.unit_scaling_convention():
      stddev *= encoder_dim.size ** -0.5
    w = mtf.get_variable(context.mesh, "w", mtf.Shape([encoder_dim, decoder_dim]),
                         initializer=tf.random_normal_initializer(stddev=stddev),
                         dtype=context.variable_dtype)
    w = mtf.cast(w, stacked.dtype)
    if context.train and self.dropout_rate:
      w = mtf.dropout(w, rate=self.dropout_rate)
    s = mtf.softmax(w, reduced_dim=encoder_dim)
    z = mtf.layers.us_einsum([s, stacked], reduced_dims=[encoder_dim])
    pieces = mtf.split(z, split_dim=decoder_dim, num_or_size_splits=decoder_dim.size)
    context.decoder_layers_per_module = [
        mtf.reshape(p, mtf.Shape([d for d in p.shape.dims if d.name != decoder_dim.name]))
        for p in pieces]
    return context.decoder_layers_per_module

  def _get_memory_antecedent(self, context):
    """The memory of the decoder module holding this layer."""
    index = getattr(context, "layer_index", 0) // self.layers_per_decoder_module
    inputs = self._get_decoder_inputs(context)
    if index >= len(inputs):
      raise MtfError("%s: layer %d is in decoder module %d, but decoder_num_modules is %d"
                     % (type(self).__name__, context.layer_index, index, len(inputs)))
    return inputs[index]


@gin.configurable(module="transformer_layers")
class BranchedSelfAttention(tl.SelfAttention):
  """The Weighted Transformer's attention: each head's output (projected to d_model
  separately) is scaled by kappa[head], sent through a DenseReluDense shared by the
  heads (variables wi, wo in this layer's scope), scaled by alpha[head] and summed over
  heads. kappa and alpha [heads] start uniform in [0, 1] and are kept non-negative
  and normalised to sum 1. Projections are stored per head (combine_dims=False)."""

  def __init__(self, **kwargs):
    super().__init__(combine_dims=False, keep_query_heads_dims=True, **kwargs)
    if self.num_memory_heads != 0:
      raise MtfError("%s: set num_memory_heads to 0 for branched attention (got %r)" % (
          type(self).__name__, self.num_memory_heads), rule="num_memory_heads")
    self.dense_layer = tl.DenseReluDense()
    self.kappa_init = tf.random_uniform_initializer(minval=0.0, maxval=1.0)
    self.alpha_init = tf.random_uniform_initializer(minval=0.0, maxval=1.0)

  def _constraint(self, z):
    """z made non-negative and normalised to sum (about) 1."""
    z = mtf.relu(z)
    return z / mtf.reduce_sum(z + 10 ** -4)

  def layer_output_from_attention_output(self, context, attention_output, losses):
    """Sum over heads of alpha * DenseReluDense(kappa * per-head output)."""
    del losses
    heads_dim = mtf.Dimension("heads", self.num_heads)
    kappa = mtf.get_variable(context.mesh, "kappa", mtf.Shape([heads_dim]),
                             initializer=self.kappa_init, dtype=context.variable_dtype)
    alpha = mtf.get_variable(context.mesh, "alpha", mtf.Shape([heads_dim]),
                             initializer=self.alpha_init, dtype=context.variable_dtype)
    dtype = attention_output.dtype
    output = attention_output * mtf.cast(self._constraint(kappa), dtype)
    output = self.dense_layer.feed_forward(context, output)
    output = output * mtf.cast(self._constraint(alpha), dtype)
    return mtf.reduce_sum(output, reduced_dim=heads_dim)


@gin.configurable(module="transformer_layers")
class BranchedEncDecAttention(_EncoderMemoryAttention, BranchedSelfAttention):
  """Branched (Weighted Transformer) attention over the encoder output."""

  supports_incremental_decoding = tl.EncDecAttention.supports_incremental_decoding

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] attends to the encoder output; returns x's shape
    (in decoding the encoder's keys and values are computed once, as in EncDecAttention)."""
    memory = tl.EncDecAttention._get_memory_antecedent(self, context)  # pylint: disable=protected-access
    with tl.class_scope(self):
      return tl.enc_dec_attention(self, memory, context, x, losses)


@gin.configurable(module="transformer_layers")
class Synthesizer(tl.SelfAttention):
  """Synthesizer self-attention (arXiv 2005.00743): attention.synthetic_attention with
  synthesize_mode ("random_plus_alpha" by default; see there). The modes without q.k
  use no keys: "random" and "factorized" have no query projection (the logits do not
  depend on the input) and, like "dense_minus", one shared projection "kv" for the
  values. attention_kwargs may set max_length and factorized_dim."""

  def __init__(self, num_heads=8, num_memory_heads=0, key_value_size=128, shared_kv=False,
               dropout_rate=0.0, attention_kwargs=None, relative_attention_type=None,
               relative_attention_num_buckets=32, attention_func=None, combine_dims=True,
               keep_query_heads_dims=False, synthesize_mode="random_plus_alpha",
               fold_scaling_into_initializer=True, **kwargs):
    if kwargs.get("use_hyperprompt"):
      raise MtfError("%s: use_hyperprompt (task prompts) is not offered with synthetic "
                     "attention; use SelfAttention" % type(self).__name__,
                     rule="use_hyperprompt")
    if synthesize_mode not in attention.SYNTHESIZE_MODES:
      raise MtfError("%s: unknown synthesize_mode %r (known: %s)" % (
          type(self).__name__, synthesize_mode, attention.SYNTHESIZE_MODES),
                     rule=str(synthesize_mode))
    super().__init__(
        num_heads=num_heads, num_memory_heads=num_memory_heads,
        key_value_size=key_value_size, shared_kv=shared_kv, dropout_rate=dropout_rate,
        attention_kwargs=attention_kwargs, relative_attention_type=relative_attention_type,
        relative_attention_num_buckets=relative_attention_num_buckets,
        attention_func=attention_func, combine_dims=combine_dims,
        keep_query_heads_dims=keep_query_heads_dims,
        fold_scaling_into_initializer=fold_scaling_into_initializer, **kwargs)
    self.synthesize_mode = synthesize_mode
    self.no_query = synthesize_mode in ("random", "factorized")
    if "plus" not in synthesize_mode:
      self.shared_kv = True

  def make_params(self, context, io_dim=None, memory_dim=None):
    """AttentionParams without "q" in the random / factorized modes."""
    return tl.attention_params(
        context, self.kv_dim, self.num_heads, self.num_memory_heads, self.shared_kv,
        no_query=self.no_query, combine_dims=self.combine_dims,
        keep_query_heads_dims=self.keep_query_heads_dims,
        fold_scaling_into_initializer=self.fold_scaling_into_initializer,
        query_input_dim=io_dim, memory_input_dim=memory_dim)

  @property
  def supports_incremental_decoding(self):
    """Cached decoding keeps the keys and values; the learned logits of the position
    decoded are the row of the table at that position."""
    return True

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] -> the same shape (in incremental decoding:
    [batch..., d_model], one position attending to the cached keys and values)."""
    with tl.class_scope(self):
      params = self.make_params(context, x.shape.dims[-1])
      m = self.rename_length_to_memory_length(x, context)
      k, v = tl._keys_and_values(params, self.shared_kv, m)  # pylint: disable=protected-access
      k, v, memory_length, memory_position = self.cached_kv(context, k, v)
      q = x if self.no_query else params.compute_q(x)
      bias = self.compute_bias(context, memory_position, x, params.query_heads_dims, q)
      o = attention.synthetic_attention(
          q, k, v, memory_length, self.kv_dim, self.kv_dim, bias=bias,
          synthesize=True, synthesize_mode=self.synthesize_mode, context=context,
          **self.attention_kwargs_from_context(context))
      attention_output = params.compute_output(
          o, output_shape=self.expected_attention_output_shape(x, params))
      return self.layer_output_from_attention_output(context, attention_output, losses)
