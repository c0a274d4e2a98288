"""The Transformer's core layers (self, encoder-decoder and local attention, feed-forward,
ParallelLayer) and the attention helpers the other attention modules build on.

A layer's `call(context, x)` creates its variables under a scope named after its class
(".../layer_000/SelfAttention/q", as in the original's checkpoints). Users import the
layers from transformer_layers, the original's module name (gin: transformer_layers.<Name>).
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import MtfError, ShapeError
from models.transformer import attention
from models.transformer import model_layout
from models.transformer import relative_position
from models.transformer.context import cached_memory, incremental_aware
from models.transformer.transformer_layer import TransformerLayer, class_scope

RELATIVE_ATTENTION_TYPES = (None, "bias", "bias_shared", "contextual")


def _model_flag(context, name):
  return bool(getattr(context.model, name, False))


def _rename_length(x, old_name, new_name="memory_length"):
  """x with dim old_name renamed (x unchanged when it has no such dim)."""
  if old_name == new_name or old_name not in x.shape.dimension_names:
    return x
  return mtf.rename_dimension(x, old_name, new_name)


def _as_tensor_or_none(x):
  return x if isinstance(x, mtf.Tensor) else None


def _model_dim(context):
  """The model's d_model Dimension (context.model.model_dim, a Dimension or an int)."""
  model_dim = getattr(context.model, "model_dim", None)
  if model_dim is None:
    raise ShapeError("attention_params: the model has no model_dim; pass query_input_dim",
                     dim="d_model")
  if isinstance(model_dim, mtf.Dimension):
    return model_dim
  return mtf.Dimension("d_model", int(model_dim))


def _heads_dims(num_heads, num_memory_heads, what):
  """(query heads dims, memory heads dims) of num_heads and num_memory_heads."""
  heads = [mtf.Dimension("heads", num_heads)]
  if num_memory_heads in (0, None):
    return heads, list(heads)
  if num_memory_heads == 1:
    return heads, []
  if num_heads % num_memory_heads:
    raise ShapeError("%s: num_memory_heads %d does not divide num_heads %d"
                     % (what, num_memory_heads, num_heads), dim="heads")
  memory_heads = [mtf.Dimension("heads", num_memory_heads)]
  query_heads = memory_heads + [mtf.Dimension("query_heads", num_heads // num_memory_heads)]
  return query_heads, memory_heads


def _keys_and_values(params, shared_kv, memory):
  """(k, v) of memory; one tensor twice with shared_kv."""
  if shared_kv:
    kv = params.compute_kv(memory)
    return kv, kv
  return params.compute_k(memory), params.compute_v(memory)


def attention_params(context, kv_dim, num_heads, num_memory_heads=0, shared_kv=False,
                     no_query=False, combine_dims=True, keep_query_heads_dims=False,
                     fold_scaling_into_initializer=True, query_input_dim=None,
                     memory_input_dim=None):
  """AttentionParams for a layer. num_memory_heads=0: each query head has its own keys
  and values; 1: one key/value head shared by all (multi-query); n > 1: query heads
  [heads=n, query_heads=num_heads/n] share keys and values along "query_heads"."""
  model_dim = query_input_dim or _model_dim(context)
  query_heads, memory_heads = _heads_dims(num_heads, num_memory_heads, "attention_params")
  return attention.AttentionParams(
      context.mesh, query_input_dim=model_dim, memory_input_dim=memory_input_dim or model_dim,
      output_dim=model_dim, key_dim=kv_dim, value_dim=kv_dim, query_heads_dims=query_heads,
      memory_heads_dims=memory_heads, variable_dtype=context.variable_dtype,
      shared_kv=shared_kv, no_query=no_query, combine_dims=combine_dims,
      ensemble_dim=None, keep_query_heads_dims=keep_query_heads_dims,
      fold_scaling_into_initializer=fold_scaling_into_initializer)


@gin.configurable(module="transformer_layers")
class DenseReluDense(TransformerLayer):
  """Position-wise feed-forward: activation(x wi) wo, with d_ff = hidden_size.

  A list of activations gives gated variants: ["gelu", "linear"] multiplies
  gelu(x wi_0) by (x wi_1). Dropout (training only) is shared along the length dim.
  """

  def __init__(self, hidden_size=4096, dropout_rate=0.0, activation="relu",
               use_bias=False):
    self.hidden_size = hidden_size
    self.dropout_rate = dropout_rate
    self.activation = activation
    self.use_bias = use_bias

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] -> the same shape."""
    del losses
    with class_scope(self):
      return self.feed_forward(context, x)

  def feed_forward(self, context, x):
    """call's computation on x [..., d_model], with wi and wo in the current scope (for
    layers that use a DenseReluDense inside, e.g. BranchedSelfAttention)."""
    io_dim = x.shape.dims[-1]
    hidden_dim = mtf.Dimension("d_ff", self.hidden_size)
    h = mtf.layers.dense_product(
        x, reduced_dims=[io_dim], new_dims=[hidden_dim],
        activation_functions=self.activation, use_bias=self.use_bias,
        variable_dtype=context.variable_dtype, name="wi")
    if context.train and self.dropout_rate:
      h = mtf.dropout(h, rate=self.dropout_rate,
                      noise_shape=h.shape - [d for d in [context.length_dim] if d])
    return mtf.layers.dense(h, [io_dim], reduced_dims=[hidden_dim],
                            use_bias=self.use_bias,
                            variable_dtype=context.variable_dtype, name="wo")


@gin.configurable(module="transformer_layers")
class SelfAttention(TransformerLayer):
  """Multi-head self-attention, causal when the model is fully autoregressive; packed
  examples (context.sequence_id a Tensor) attend only within their segment.

  relative_attention_type: None; "bias" (a per-layer table "relative_attention_bias"
  [heads, buckets] of bucketed relative positions, bidirectional unless the model is
  autoregressive); "bias_shared" (one such table in context.shared_params); or
  "contextual" (q . a[bucket], a the kernel "relative_attention_ak/kernel").
  z_loss_coeff adds coeff * mean(logsumexp(logits)^2) to context.losses in training.
  attention_func: None (softmax), "hybrid" (attention.hybrid_attention) or a function
  like attention.attention. use_hyperprompt prepends each example's task prompts to the
  keys and values (attention.concat_hyper_prompts_kv; hyperprompt_* as there); such a
  layer decodes by recomputing the prefix.
  """

  def __init__(self, num_heads=8, num_memory_heads=0, key_value_size=128, shared_kv=False,
               dropout_rate=0.0, attention_kwargs=None, relative_attention_type=None,
               relative_attention_num_buckets=32, attention_func=None, combine_dims=True,
               keep_query_heads_dims=False, fold_scaling_into_initializer=True,
               z_loss_coeff=None, use_hyperprompt=False, hyperprompt_mtlshare=False,
               hyperprompt_length_encoder=None, hyperprompt_length_decoder=None,
               hyperprompt_hidden_dim=None, hyperprompt_task_num=8):
    if relative_attention_type not in RELATIVE_ATTENTION_TYPES:
      raise MtfError("%s: unknown relative_attention_type %r (known: %s)" % (
          type(self).__name__, relative_attention_type, RELATIVE_ATTENTION_TYPES),
                     rule=str(relative_attention_type))
    if (attention_func is not None and attention_func != "hybrid"
        and not callable(attention_func)):
      raise MtfError("%s: attention_func %r is neither 'hybrid' nor callable" % (
          type(self).__name__, attention_func), rule=str(attention_func))
    for name, value in list(locals().items()):  # each argument, as its attribute
      if name != "self":
        setattr(self, name, value)
    self.attention_kwargs = dict(attention_kwargs or {})

  @property
  def kv_dim(self):
    """The key/value size dim "d_kv"."""
    return mtf.Dimension("d_kv", self.key_value_size)

  def make_params(self, context, io_dim=None, memory_dim=None):
    """The layer's AttentionParams (creates its variables in the current scope)."""
    return attention_params(
        context, self.kv_dim, self.num_heads, self.num_memory_heads, self.shared_kv,
        combine_dims=self.combine_dims, keep_query_heads_dims=self.keep_query_heads_dims,
        fold_scaling_into_initializer=self.fold_scaling_into_initializer,
        query_input_dim=io_dim, memory_input_dim=memory_dim)

  def attention_kwargs_from_context(self, context):
    """Keyword arguments of the attention function for this call."""
    kwargs = dict(self.attention_kwargs)
    kwargs["dropout_rate"] = self.dropout_rate if context.train else 0.0
    kwargs.setdefault("dropout_broadcast_dims", [context.length_dim])
    if self.z_loss_coeff:
      kwargs["z_loss_coeff"] = self.z_loss_coeff
    return kwargs

  @property
  def attention_fn(self):
    """The attention function: attention.attention, attention.hybrid_attention for
    attention_func="hybrid", or the attention_func given."""
    if self.attention_func == "hybrid":
      return attention.hybrid_attention
    return self.attention_func or attention.attention

  def min_relative_position(self, context):
    """The smallest memory-minus-query position a query sees (None: no limit)."""
    del context
    return None

  def max_relative_position(self, context):
    """The largest memory-minus-query position a query sees: 0 when causal."""
    return 0 if _model_flag(context, "fully_autoregressive") else None

  def expected_attention_output_shape(self, x, params):
    """x's shape, with the query heads before d_model if keep_query_heads_dims."""
    if self.keep_query_heads_dims:
      return mtf.Shape(x.shape.dims[:-1] + params.query_heads_dims + x.shape.dims[-1:])
    return x.shape

  def layer_output_from_attention_output(self, context, attention_output, losses):
    """The layer's output from the projected attention output (here unchanged)."""
    del context, losses
    return attention_output

  def memory_length(self, context):
    """The memory dim of self-attention: the length dim renamed "memory_length"."""
    return mtf.Dimension("memory_length", context.length_dim.size)

  def rename_length_to_memory_length(self, x, context):
    """x with the context's length dim called "memory_length" (if it has one)."""
    if context.length_dim is None:
      return x
    return _rename_length(x, context.length_dim.name)

  def _relative_bias(self, context, query_position, memory_position, heads_dims,
                     bidirectional, q=None):
    if self.relative_attention_type is None:
      return None
    rel = memory_position - query_position
    if self.relative_attention_type == "contextual":
      return self._contextual_relative_bias(context, rel, heads_dims, bidirectional, q)
    make = lambda: relative_position.relative_attention_bias_variable(
        context.mesh, heads_dims, self.relative_attention_num_buckets,
        context.variable_dtype)
    table = _bias_table(self, context, "relative_attention_bias", make)
    return mtf.cast(relative_position.relative_position_bias(table, rel, bidirectional),
                    context.activation_dtype)

  def _contextual_relative_bias(self, context, rel, heads_dims, bidirectional, q):
    """q . a[bucket of rel], a the kernel "relative_attention_ak/kernel"."""
    if q is None or self.kv_dim not in q.shape.dims:
      raise MtfError("%s: relative_attention_type 'contextual' needs the queries (with "
                     "dim %s)" % (type(self).__name__, self.kv_dim), rule="contextual")
    buckets_dim = mtf.Dimension("buckets", self.relative_attention_num_buckets)
    ensemble = list(getattr(context.model, "ensemble_dims", None) or [])
    values = mtf.layers.dense(q, [buckets_dim], reduced_dims=[self.kv_dim], use_bias=False,
                              variable_dtype=context.variable_dtype,
                              name="relative_attention_ak",
                              expert_dims=ensemble + list(heads_dims))
    buckets = relative_position.relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=buckets_dim.size)
    one_hot = mtf.one_hot(buckets, buckets_dim, dtype=values.dtype)
    out = [d for d in values.shape.dims if d != buckets_dim]
    out += [d for d in one_hot.shape.dims if d not in out and d != buckets_dim]
    return mtf.cast(mtf.einsum([values, one_hot], output_shape=mtf.Shape(out)),
                    context.activation_dtype)

  def compute_bias(self, context, memory_position, x, heads_dims, q, use_prompt_kv=None):
    """The additive bias: the relative-position window, segment and read/write-priority
    masks, plus the relative-position bias. use_prompt_kv: the number of (always
    visible) prompt positions prepended to the memory, or None."""
    del x
    bias = self._memory_bias(context, memory_position, heads_dims, q)
    if use_prompt_kv and bias is not None:
      bias = mtf.pad(bias, [use_prompt_kv, 0], "memory_length")
    return bias

  def _memory_bias(self, context, memory_position, heads_dims, q):
    query_position = context.get_position()
    relative = memory_position - query_position
    visible = None

    def restrict(visible, allowed):
      return allowed if visible is None else mtf.logical_and(visible, allowed)
    low = self.min_relative_position(context)
    high = self.max_relative_position(context)
    if low is not None:
      visible = restrict(visible, mtf.greater_equal(relative, low))
    if high is not None:
      visible = restrict(visible, mtf.less_equal(relative, high))
    sequence_id = _as_tensor_or_none(context.sequence_id)
    if sequence_id is not None:
      visible = restrict(visible, mtf.equal(
          sequence_id, self.rename_length_to_memory_length(sequence_id, context)))
    if context.read_priority is not None and context.write_priority is not None:
      # A prefix LM: memory is visible when written no later than the query reads.
      visible = restrict(visible, mtf.less_equal(
          self.rename_length_to_memory_length(context.write_priority, context),
          context.read_priority))
    bias = None
    if visible is not None:
      bias = attention.visibility_mask_to_attention_bias(visible, context.activation_dtype)
    rel_bias = self._relative_bias(context, query_position, memory_position, heads_dims,
                                   bidirectional=not _model_flag(context, "autoregressive"),
                                   q=q)
    if rel_bias is not None:
      bias = rel_bias if bias is None else bias + rel_bias
    return bias

  @property
  def supports_incremental_decoding(self):
    """Whether cached decoding can run this layer one position at a time: plain
    softmax attention (no attention_func) without task prompts."""
    return self.attention_func is None and not self.use_hyperprompt

  def concat_prompts(self, context, k, v, memory_length):
    """(k, v, memory_length, prompt length) with the task prompts prepended."""
    side = "decoder" if _model_flag(context, "autoregressive") else "encoder"
    length = getattr(self, "hyperprompt_length_" + side)
    k, v, memory_length = attention.concat_hyper_prompts_kv(
        k, v, side, True, memory_length, self.hyperprompt_task_num, self.num_heads,
        self.hyperprompt_hidden_dim, self.kv_dim, context, self.hyperprompt_mtlshare,
        self.dropout_rate if context.train else 0.0, length)
    return k, v, memory_length, length

  def cached_kv(self, context, k, v):
    """(k, v, memory_length, memory_position) after the decoding caches (see
    memory_through_caches)."""
    if self.shared_kv:
      (k,), memory_length, memory_position = memory_through_caches(self, context, [k])
      return k, k, memory_length, memory_position
    (k, v), memory_length, memory_position = memory_through_caches(self, context, [k, v])
    return k, v, memory_length, memory_position

  def compute_qkv(self, context, params, x):
    """Queries, keys and values of x (keys and values over "memory_length")."""
    q = params.compute_q(x)
    memory = self.rename_length_to_memory_length(x, context)
    return (q,) + _keys_and_values(params, self.shared_kv, memory)

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] -> the same shape (in incremental decoding:
    [batch..., d_model], one position attending to the cached keys and values)."""
    io_dim = x.shape.dims[-1]
    with class_scope(self):
      params = self.make_params(context, io_dim)
      q, k, v = self.compute_qkv(context, params, x)
      k, v, memory_length, memory_position = self.cached_kv(context, k, v)
      prompts = None
      if self.use_hyperprompt:
        k, v, memory_length, prompts = self.concat_prompts(context, k, v, memory_length)
      bias = self.compute_bias(context, memory_position, x, params.query_heads_dims, q,
                               use_prompt_kv=prompts)
      o = self.attention_fn(q, k, v, memory_length_dim=memory_length, key_dim=self.kv_dim,
                            value_dim=self.kv_dim, bias=bias, context=context,
                            **self.attention_kwargs_from_context(context))
      attention_output = params.compute_output(
          o, output_shape=self.expected_attention_output_shape(x, params))
      return self.layer_output_from_attention_output(context, attention_output, losses)


def memory_through_caches(layer, context, tensors):
  """(tensors, memory_length, memory_position) of a self-attention layer's memory tensors
  (keys, values, ...) after context.cached_memory: in incremental mode the whole cache
  and its positions, else the length dim renamed "memory_length"."""
  tensors = cached_memory(context, tensors)
  if context.incremental:
    memory_length = tensors[0].shape.get_dim_by_name("memory_length")
    return tensors, memory_length, mtf.range(context.mesh, memory_length, tf.int32)
  memory_position = layer.rename_length_to_memory_length(context.get_position(), context)
  return tensors, layer.memory_length(context), memory_position


def _as_memory(memory, what, length_axis=-2):
  """memory with its length dim (dims[length_axis]) called "memory_length"."""
  if memory.shape.has_dim("memory_length"):
    return memory
  if memory.shape.ndims < -length_axis:
    raise ShapeError("%s: memory %s %s has no length dim" % (what, memory.name, memory.shape),
                     tensor=memory.name, dim="memory_length")
  return _rename_length(memory, memory.shape.dims[length_axis].name)


def _memory_length_dim(memory, what):
  """The "memory_length" dim of an encoder output (renamed from its dims[-2])."""
  return _as_memory(memory, what).shape.get_dim_by_name("memory_length")


def _encoder_sequence_id(layer, context, memory_length):
  """context.encoder_sequence_id with its length dim called like memory_length."""
  encoder_id = _as_tensor_or_none(context.encoder_sequence_id)
  if encoder_id is None or memory_length in encoder_id.shape.dims:
    return encoder_id
  length_dims = [d for d in encoder_id.shape.dims if d.size == memory_length.size]
  if not length_dims:
    raise ShapeError("%s: encoder_sequence_id %s has no dim of the encoder length %s" %
                     (type(layer).__name__, encoder_id.shape, memory_length),
                     tensor=encoder_id.name, dim=memory_length.name)
  return _rename_length(encoder_id, length_dims[-1].name, memory_length.name)


@gin.configurable(module="transformer_layers")
def relative_position_spans(context, num_sentinels=gin.REQUIRED):
  """Relative positions [batch..., length, memory_length] for span-filling targets.

  The inputs have spans replaced by one sentinel each (the last num_sentinels ids of the
  vocabulary); the targets are the spans, each after its sentinel. A target token's
  position to input position j is j minus the input position of the sentinel opening
  its span (0 before any). Reads context.inputs, context.encoder_inputs and the
  vocabulary size of context.model.
  """
  decoder_ids, encoder_ids = context.inputs, context.encoder_inputs
  if decoder_ids is None or encoder_ids is None:
    raise MtfError("relative_position_spans: needs context.inputs and "
                   "context.encoder_inputs (the decoder and encoder token ids)")
  model = context.model
  vocab_size = getattr(model, "input_vocab_size", None) or getattr(
      model, "output_vocab_size", None)
  if not vocab_size:
    raise MtfError("relative_position_spans: the model has no vocabulary size")
  encoder_ids = _as_memory(encoder_ids, "relative_position_spans", length_axis=-1)
  memory_length = encoder_ids.shape.get_dim_by_name("memory_length")
  length_dim = context.length_dim

  def sentinel(ids):
    return mtf.cast(mtf.greater_equal(ids, vocab_size - num_sentinels), tf.int32)
  encoder_sentinel = sentinel(encoder_ids)
  # How many sentinels each token follows (itself included).
  decoder_count = mtf.cumsum(sentinel(decoder_ids), length_dim)
  encoder_count = mtf.cumsum(encoder_sentinel, memory_length) * encoder_sentinel
  encoder_position = mtf.range(context.mesh, memory_length, tf.int32)
  # The input position of the sentinel that opened each target token's span (0: none).
  matches = mtf.cast(mtf.logical_and(mtf.equal(decoder_count, encoder_count),
                                     mtf.greater(decoder_count, 0)), tf.int32)
  anchor = mtf.reduce_sum(matches * encoder_position, reduced_dim=memory_length)
  return anchor * -1 + encoder_position  # [batch..., length, memory_length]


def enc_dec_attention_bias(layer, context, heads_dims,
                           relative_position_fn=relative_position_spans):
  """The additive bias of encoder-decoder attention: segment mask plus relative bias.

  A query sees the encoder positions whose context.encoder_sequence_id matches its
  context.sequence_id (without sequence_id: the non-padding ones). relative_attention_type
  "bias" / "bias_shared" adds a table "enc_dec_relative_attention_bias" [heads, buckets]
  looked up at the bidirectional bucket of relative_position_fn(context).
  """
  memory_length = _memory_length_dim(context.encoder_output, type(layer).__name__)
  bias = None
  encoder_id = _encoder_sequence_id(layer, context, memory_length)
  if encoder_id is not None:
    decoder_id = _as_tensor_or_none(context.sequence_id)
    if decoder_id is None:
      visible = mtf.not_equal(encoder_id, 0)
    else:
      visible = mtf.equal(decoder_id, encoder_id)
    bias = attention.visibility_mask_to_attention_bias(visible, context.activation_dtype)
  kind = layer.relative_attention_type
  if kind is None:
    return bias
  if kind not in ("bias", "bias_shared"):
    raise MtfError("%s: relative_attention_type %r is not supported in encoder-decoder "
                   "attention (use 'bias' or 'bias_shared')" % (type(layer).__name__, kind),
                   rule=str(kind))
  name = "enc_dec_relative_attention_bias"
  buckets_dim = mtf.Dimension("buckets", layer.relative_attention_num_buckets)

  def make():
    return mtf.get_variable(context.mesh, name, mtf.Shape(list(heads_dims) + [buckets_dim]),
                            initializer=tf.compat.v1.random_normal_initializer(),
                            dtype=context.variable_dtype)
  table = _bias_table(layer, context, name, make)
  rel_bias = mtf.cast(relative_position.relative_position_bias(
      table, relative_position_fn(context), bidirectional=True), context.activation_dtype)
  return rel_bias if bias is None else bias + rel_bias


def _bias_table(layer, context, key, make):
  """make() for "bias"; for "bias_shared" the table in context.shared_params[key]."""
  if layer.relative_attention_type == "bias":
    return make()
  if context.shared_params is None:
    raise MtfError("%s: relative_attention_type 'bias_shared' needs context.shared_params "
                   "(a dict) to hold the shared table" % type(layer).__name__,
                   rule="bias_shared")
  if key not in context.shared_params:
    context.shared_params[key] = make()
  return context.shared_params[key]


def enc_dec_attention(self_attention_layer, memory_antecedent, context, x, losses,
                      attention_fn=attention.attention, z_loss_coeff=None):
  """Multi-head attention from x to memory_antecedent (the encoder output; length dim
  "memory_length" or its dims[-2]): the body of EncDecAttention.call."""
  layer = self_attention_layer
  memory = _as_memory(memory_antecedent, type(layer).__name__)
  memory_length = memory.shape.get_dim_by_name("memory_length")
  params = layer.make_params(context, x.shape.dims[-1], memory.shape.dims[-1])
  q = params.compute_q(x)
  if context.incremental and context.constant_states is not None:
    # Decoding: the keys and values of the encoder output computed in first_part mode.
    k, v = context.get_constant_state()
  else:
    k, v = _keys_and_values(params, layer.shared_kv, memory)
    if context.mode == "first_part" and context.constant_states is not None:
      context.record_constant_state((k, v))
  bias = enc_dec_attention_bias(layer, context, params.query_heads_dims)
  kwargs = layer.attention_kwargs_from_context(context)
  if z_loss_coeff:
    kwargs["z_loss_coeff"] = z_loss_coeff
  o = attention_fn(q, k, v, memory_length_dim=memory_length, key_dim=layer.kv_dim,
                   value_dim=layer.kv_dim, bias=bias, context=context, **kwargs)
  attention_output = params.compute_output(
      o, output_shape=layer.expected_attention_output_shape(x, params))
  return layer.layer_output_from_attention_output(context, attention_output, losses)


@gin.configurable(module="transformer_layers")
class EncDecAttention(SelfAttention):
  """Attention from the decoder to context.encoder_output (variables "EncDecAttention/*");
  masking and relative biases as in enc_dec_attention_bias."""

  def __init__(self, relative_attention_type=None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  @property
  def attention_fn(self):
    """attention.attention, or a callable attention_func ("hybrid" needs self-attention)."""
    if callable(self.attention_func):
      return self.attention_func
    return attention.attention

  def _get_memory_antecedent(self, context):
    """The encoder output this layer attends to."""
    memory = context.encoder_output
    if memory is None:
      raise MtfError("%s layer %r: context.encoder_output is None; this layer needs the "
                     "encoder's output (use it in a Bitransformer's decoder)" % (
                         type(self).__name__, self.name), op=self.name)
    return memory

  @property
  def supports_incremental_decoding(self):
    """Cached decoding reads the encoder's keys and values computed once; the relative-
    position spans of a relative_attention_type need the whole target sequence."""
    return not callable(self.attention_func) and self.relative_attention_type is None

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] attends to the encoder output; returns x's shape."""
    with class_scope(self):
      return enc_dec_attention(self, self._get_memory_antecedent(context), context, x,
                               losses, attention_fn=self.attention_fn)


def _length_dim_num_splits(context):
  """Over how many processors the model's layout splits the length dim (1 if unknown)."""
  return model_layout.split_size(context.mesh_layout, context.length_dim)


@gin.configurable(module="transformer_layers")
class LocalSelfAttention(SelfAttention):
  """Self-attention to the memory positions (p - radius, p + radius] of query p ((p -
  radius, p] when causal), computed block by block (attention.local_attention_1d)."""

  def __init__(self, radius=128, num_heads=8, num_memory_heads=0, key_value_size=128,
               shared_kv=False, dropout_rate=0.0, attention_kwargs=None,
               combine_dims=True, keep_query_heads_dims=False,
               fold_scaling_into_initializer=True, z_loss_coeff=None):
    super().__init__(num_heads=num_heads, num_memory_heads=num_memory_heads,
                     key_value_size=key_value_size, shared_kv=shared_kv,
                     dropout_rate=dropout_rate, attention_kwargs=attention_kwargs,
                     combine_dims=combine_dims, keep_query_heads_dims=keep_query_heads_dims,
                     fold_scaling_into_initializer=fold_scaling_into_initializer,
                     z_loss_coeff=z_loss_coeff)
    self.radius = radius

  @property
  def window_dim(self):
    """The "window" dim of radius positions (the memory a causal query sees)."""
    return mtf.Dimension("window", self.radius)

  def min_relative_position(self, context):
    """1 - radius: a query sees at most radius - 1 positions back."""
    del context
    return 1 - self.radius

  def max_relative_position(self, context):
    """0 when causal, else radius."""
    return 0 if _model_flag(context, "fully_autoregressive") else self.radius

  @property
  def supports_incremental_decoding(self):
    """Cached decoding attends to the cached window of radius positions."""
    return True

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] -> the same shape."""
    del losses
    with class_scope(self):
      params = self.make_params(context, x.shape.dims[-1])
      q = params.compute_q(x)
      k, v = _keys_and_values(params, self.shared_kv, x)
      if context.incremental:
        return self._call_incremental(context, x, params, q, k, v)
      if context.mode == "first_part":
        memory = [_rename_length(t, context.length_dim.name) for t in (k, v)]
        cached_memory(context, memory[:1] if self.shared_kv else memory)
      kwargs = self.attention_kwargs_from_context(context)
      kwargs["context"] = context
      o = attention.local_attention_1d(
          q, k, v, context.length_dim, self.kv_dim, self.kv_dim,
          fully_autoregressive=_model_flag(context, "fully_autoregressive"),
          length_dim_num_splits=_length_dim_num_splits(context), radius=self.radius,
          sequence_id=context.sequence_id, write_priority=context.write_priority,
          read_priority=context.read_priority, attention_kwargs=kwargs)
      return params.compute_output(o, output_shape=x.shape)

  def _call_incremental(self, context, x, params, q, k, v):
    """One query attends to the cached keys and values of its window."""
    k, v, memory_length, memory_position = self.cached_kv(context, k, v)
    bias = self.compute_bias(context, memory_position, x, params.query_heads_dims, q)
    o = attention.attention(q, k, v, memory_length, self.kv_dim, self.kv_dim, bias=bias,
                            context=context, **self.attention_kwargs_from_context(context))
    return params.compute_output(o, output_shape=x.shape)


@gin.configurable(module="transformer_layers")
class ParallelLayer(TransformerLayer):
  """Several layers on the same input, their outputs summed and scaled by 1/sqrt(number
  of layers); with use_scope layer i's variables go under "parallel_layer_<i>"."""

  def __init__(self, layer_classes=(DenseReluDense, SelfAttention), use_scope=True):
    self.layer_classes = [c() if isinstance(c, type) else c for c in layer_classes]
    self.use_scope = use_scope

  @property
  def supports_incremental_decoding(self):
    """Whether every parallel layer supports cached decoding."""
    from models.transformer import decoding  # pylint: disable=g-import-not-at-top
    return all(decoding.layer_supports_incremental(l) for l in self.layer_classes)

  @incremental_aware
  def call(self, context, x, losses=None):
    """Sum of the layers' outputs on x, times len(layers)**-0.5."""
    outputs = []
    with class_scope(self):
      for i, layer in enumerate(self.layer_classes):
        if self.use_scope:
          with mtf.variable_scope("parallel_layer_%d" % i):
            outputs.append(layer.call(context, x, losses=losses))
        else:
          outputs.append(layer.call(context, x, losses=losses))
    return mtf.add_n(outputs) * (len(outputs) ** -0.5)
