"""Dot-product attention over named dims and the q/k/v/o projection weights (the
original's transformer/attention.py): `attention`, `AttentionParams` (variables stored as
in the original's checkpoints), `local_attention_1d`, the variants `hybrid_attention` and
`synthetic_attention`, `ExpertsAttentionParams`, and the task-prompt helpers of
hyper_prompts.py.
"""
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import MtfError, ShapeError
from mesh_tf.ops.halo import halo_exchange_sides
from mesh_tf.ops import fused_attention
# pylint: disable=unused-import
from models.transformer.hyper_prompts import (concat_hyper_prompts_kv,
                                              make_params_hyperprompt,
                                              make_params_mtlprompt)
# pylint: enable=unused-import

# Added to the logits of memory positions a query must not see.
NEG_INF = -1e9


def visibility_mask_to_attention_bias(visible, dtype):
  """0 where visible is True, -1e9 where it is False (an additive attention bias)."""
  return mtf.cast(mtf.logical_not(visible), dtype) * NEG_INF


def _logits_shape(q, k, key_dim):
  dims = [d for d in q.shape.dims if d != key_dim]
  dims += [d for d in k.shape.dims if d not in dims and d != key_dim]
  return mtf.Shape(dims)


def attention_logits_z_loss(logits, memory_length_dim, coeff):
  """coeff * mean over queries of logsumexp(logits over memory)^2 (keeps logits small)."""
  lse = mtf.reduce_logsumexp(mtf.cast(logits, tf.float32), memory_length_dim)
  return mtf.reduce_mean(mtf.square(lse)) * coeff


def attention(q, k, v, memory_length_dim, key_dim, value_dim, bias=None, dropout_rate=0.0,
              dropout_broadcast_dims=None, extra_logit=None, context=None,
              float32_logits=True, z_loss_coeff=None):
  """softmax over memory_length_dim of (q.k + bias), times v.

  Args:
    q: [batch..., heads..., length?, key_dim].
    k: [batch..., heads..., memory_length_dim, key_dim].
    v: [batch..., heads..., memory_length_dim, value_dim].
    memory_length_dim: the dim the softmax runs over.
    key_dim, value_dim: the dims contracted with q and produced from v.
    bias: None or an additive bias broadcastable to the logits (0 / -1e9 entries).
    dropout_rate: dropout on the attention weights (callers pass 0.0 outside training).
    dropout_broadcast_dims: dims along which one dropout mask is shared.
    extra_logit: an extra logit (e.g. 0.0) in the softmax denominator.
    context: the layer's Context; receives the z-loss (training only).
    float32_logits: compute logits and softmax in float32 whatever q's dtype.
    z_loss_coeff: if set, adds attention_logits_z_loss to context.losses when training.

  Returns:
    q's dims without key_dim, followed by value_dim.
  """
  for tensor, need in ((q, key_dim), (k, key_dim), (k, memory_length_dim),
                       (v, memory_length_dim), (v, value_dim)):
    if need not in tensor.shape.dims:
      raise ShapeError("attention: %s %s lacks dim %s" % (tensor.name, tensor.shape, need),
                       tensor=tensor.name, dim=need.name)
  output_dims = [d for d in q.shape.dims if d != key_dim] + [value_dim]
  q, k, v, bias = maybe_reshape_attention_input_for_2d_sharding(
      context, q, k, v, bias, [key_dim, value_dim])
  if float32_logits:
    q, k = mtf.cast(q, tf.float32), mtf.cast(k, tf.float32)
  wants_z_loss = bool(z_loss_coeff and context is not None and context.train
                      and context.losses is not None)
  logits_shape = _logits_shape(q, k, key_dim)
  local_output_shape = mtf.Shape([d for d in q.shape.dims if d != key_dim] + [value_dim])
  noise_shape = (logits_shape - list(dropout_broadcast_dims or [])) if dropout_rate else None
  outputs = None
  if not (wants_z_loss or extra_logit is not None):
    outputs = fused_attention.dot_product_attention(
        q, k, v, None if bias is None else mtf.cast(bias, q.dtype), key_dim,
        memory_length_dim, value_dim, local_output_shape, dropout_rate=dropout_rate,
        dropout_noise_shape=noise_shape)
  if outputs is None:
    logits = mtf.einsum([q, k], output_shape=logits_shape)
    if bias is not None:
      logits += mtf.cast(bias, logits.dtype)
    if wants_z_loss:
      context.losses.append(attention_logits_z_loss(logits, memory_length_dim, z_loss_coeff))
    weights = mtf.cast(mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit),
                       v.dtype)
    if dropout_rate:
      weights = mtf.dropout(weights, rate=dropout_rate, noise_shape=noise_shape)
    outputs = mtf.einsum([weights, v], output_shape=local_output_shape)
  if outputs.shape.dims != output_dims:  # undo the 2-D sharding reshape
    outputs = mtf.reshape(outputs, mtf.Shape(output_dims))
  return outputs


def _dropout_weights(weights, dropout_rate, dropout_broadcast_dims, context):
  """Dropout on attention weights (skipped at rate 0 and outside training)."""
  if not dropout_rate or (context is not None and not context.train):
    return weights
  noise_shape = weights.shape - list(dropout_broadcast_dims or [])
  return mtf.dropout(weights, rate=dropout_rate, noise_shape=noise_shape)


def _require_dim(tensor, name, what):
  """tensor's dim called name, or a ShapeError naming what needs it."""
  if not tensor.shape.has_dim(name):
    raise ShapeError("%s: %s %s has no dim %r" % (what, tensor.name, tensor.shape, name),
                     tensor=tensor.name, dim=name)
  return tensor.shape.get_dim_by_name(name)


def hybrid_attention(q, k, v, context, memory_length_dim, key_dim, value_dim, bias=None,
                     dropout_rate=0.0, dropout_broadcast_dims=None, extra_logit=None):
  """Softmax attention blended with doubly-normalised attention (self-attention only).

  The doubly-normalised weights are a log-softmax of the logits over the queries (q's
  "length" dim, as long as the memory), then a softmax over the memory; the weights are
  c * doubly + (1 - c) * softmax, c the scalar variable "doubly_coeff" (initially 0.5)
  clipped to [0, 1]. Arguments as in attention(). Returns q's dims without key_dim,
  then value_dim.
  """
  query_length_dim = mtf.Dimension("length", memory_length_dim.size)
  if query_length_dim not in q.shape.dims:
    raise ShapeError("hybrid_attention: q %s %s needs a query dim %s as long as the "
                     "memory (it normalises over the queries)" % (
                         q.name, q.shape, query_length_dim), tensor=q.name, dim="length")
  logits = mtf.einsum([q, k], output_shape=_logits_shape(q, k, key_dim))
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  coeff = mtf.get_variable(context.mesh, "doubly_coeff", mtf.Shape([]),
                           initializer=tf.constant_initializer(0.5),
                           dtype=context.variable_dtype)
  coeff = mtf.maximum(mtf.minimum(mtf.cast(coeff, logits.dtype), 1.0), 0.0)
  upper = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  lower_log = mtf.log_softmax(logits, query_length_dim, extra_logit=extra_logit)
  doubly = mtf.softmax(lower_log, memory_length_dim, extra_logit=extra_logit)
  weights = coeff * doubly + (1.0 - coeff) * upper
  weights = _dropout_weights(weights, dropout_rate, dropout_broadcast_dims, context)
  output_dims = [d for d in q.shape.dims if d != key_dim] + [value_dim]
  return mtf.einsum([weights, v], output_shape=mtf.Shape(output_dims))


SYNTHESIZE_MODES = ("random", "factorized", "dense_minus", "random_plus_alpha",
                    "random_plus", "dense_plus_alpha", "dense_plus")


def _synthetic_table(q, memory_length_dim, r, what, context=None):
  """The learned [length, heads, memory_length] table r cut to this call's lengths (in
  incremental decoding the row of context.position)."""
  r = mtf.slice(r, 0, memory_length_dim.size, memory_length_dim.name)
  if getattr(context, "incremental", False) and not q.shape.has_dim("length"):
    return mtf.gather(r, context.position, r.shape.get_dim_by_name("length"))
  length_dim = _require_dim(q, "length", what)
  return mtf.slice(r, 0, length_dim.size, length_dim.name)


def _dense_synthetic_logits(q, key_dim, memory_length_dim, max_length):
  """Dense Synthesizer logits: relu(q) projected to max_length memory positions ("pi")."""
  tmp_dim = mtf.Dimension(memory_length_dim.name, max_length)
  logits = mtf.layers.dense(mtf.relu(q), [tmp_dim], reduced_dims=[key_dim], use_bias=False,
                            name="pi")
  return mtf.slice(logits, 0, memory_length_dim.size, memory_length_dim.name)


def _mix_alpha(logits, r, mode, context):
  """logits + r; (1 - a) logits + a r, a = sigmoid("alpha"), in the *_alpha modes."""
  if "alpha" not in mode:
    return logits + r
  alpha = mtf.get_variable(context.mesh, "alpha", mtf.Shape([mtf.Dimension("alpha", 1)]),
                           initializer=tf.zeros_initializer(), dtype=context.variable_dtype)
  alpha = mtf.sigmoid(mtf.cast(alpha, logits.dtype))
  return (1.0 - alpha) * logits + alpha * r


def synthetic_attention(q, k, v, memory_length_dim, key_dim, value_dim, bias=None,
                        dropout_rate=0.0, dropout_broadcast_dims=None, extra_logit=None,
                        synthesize=True, synthesize_mode="random_plus_alpha",
                        factorized_dim=16, max_length=512, context=None):
  """Synthesizer attention (Tay et al. 2020, arXiv 2005.00743): learned logits.

  synthesize_mode:
    "random": logits are a learned table "R" [length, heads, memory_length] (each
      max_length long, cut to this call's lengths), independent of the inputs; q is
      the layer input (no query projection).
    "factorized": the table is R1 . R2 over a "tmp" dim of factorized_dim.
    "dense_minus": logits are relu(q) projected by "pi/kernel" [key_dim, max_length].
    "random_plus" / "dense_plus": q.k plus the random / dense logits;
    "*_plus_alpha": (1 - a) q.k + a (random / dense logits), a = sigmoid("alpha").
  With synthesize=False this is plain softmax(q.k + bias) attention. Other arguments as
  in attention(). Returns q's dims without its last dim, then (random / factorized
  modes) v's "heads" dim, then value_dim.
  """
  what = "synthetic_attention"
  mode = synthesize_mode
  if synthesize and mode not in SYNTHESIZE_MODES:
    raise MtfError("%s: unknown synthesize_mode %r (known: %s)" % (
        what, mode, SYNTHESIZE_MODES), rule=str(mode))
  if synthesize and context is None:
    raise MtfError("%s: synthesize=True needs the layer's context (for its variables)"
                   % what, rule=str(mode))
  heads_dim = None
  bounded = [memory_length_dim]  # the learned logits cover max_length positions
  if not mode.startswith("dense") and q.shape.has_dim("length"):
    bounded.append(q.shape.get_dim_by_name("length"))
  for dim in bounded:
    if synthesize and dim.size > max_length:
      raise ShapeError("%s: %s is longer than max_length %d (the size of the learned "
                       "logits)" % (what, dim, max_length), tensor=q.name, dim=dim.name)
  if synthesize and mode in ("random", "factorized", "random_plus", "random_plus_alpha"):
    heads_dim = _require_dim(v, "heads", what)
    length = mtf.Dimension("length", max_length)
    memory = mtf.Dimension(memory_length_dim.name, max_length)
    if mode == "factorized":
      tmp = mtf.Dimension("tmp", factorized_dim)
      r1 = mtf.get_variable(context.mesh, "R1", mtf.Shape([tmp, heads_dim, memory]),
                            dtype=context.variable_dtype)
      r2 = mtf.get_variable(context.mesh, "R2", mtf.Shape([tmp, heads_dim, memory]),
                            dtype=context.variable_dtype)
      # R1 and R2 share their dim names, so "length" is R1's memory axis renamed.
      r = mtf.einsum([mtf.rename_dimension(r1, memory.name, length.name), r2],
                     output_shape=mtf.Shape([length, heads_dim, memory]))
    else:
      r = mtf.get_variable(context.mesh, "R", mtf.Shape([length, heads_dim, memory]),
                           dtype=context.variable_dtype)
    r = _synthetic_table(q, memory_length_dim, mtf.cast(r, q.dtype), what, context)
  elif synthesize:
    r = _dense_synthetic_logits(q, key_dim, memory_length_dim, max_length)
  if synthesize and "plus" not in mode:
    logits = r
  else:
    logits = mtf.einsum([q, k], output_shape=_logits_shape(q, k, key_dim))
    if synthesize:
      logits = _mix_alpha(logits, r, mode, context)
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  weights = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  weights = _dropout_weights(weights, dropout_rate, dropout_broadcast_dims, context)
  if synthesize and "plus" not in mode:
    output_dims = q.shape.dims[:-1] + ([heads_dim] if heads_dim else []) + [value_dim]
  else:
    output_dims = [d for d in q.shape.dims if d != key_dim] + [value_dim]
  return mtf.einsum([weights, v], output_shape=mtf.Shape(output_dims))


def maybe_reshape_attention_input_for_2d_sharding(context, q, k, v, bias,
                                                  unsplittable_dims):
  """Splits a dim of the attention inputs over a mesh dim the attention leaves idle.

  With 2-D model parallelism (d_model over one mesh dim, heads over the other) the
  attention, which has no d_model, would run replicated over the first. This finds such
  an idle mesh dim M (from context.mesh_layout), a tensor-dim name N the layout maps to
  M that no input has, and a dim D of q, k and v (not in unsplittable_dims) whose size M
  divides, and reshapes D to [D / |M|, N of size |M|] in every input that has it.
  Returns (q, k, v, bias), unchanged when nothing applies.
  """
  unchanged = q, k, v, bias
  mesh_layout = getattr(context, "mesh_layout", None)
  if mesh_layout is None:
    return unchanged
  mesh_shape, rules = mesh_layout.shape, mesh_layout.layout_rules
  tensors = [t for t in unchanged if t is not None]
  names = {d.name for t in tensors for d in t.shape.dims}
  used = {rules.tensor_dimension_to_mesh_axis(name, mesh_shape) for name in names}
  for axis, mesh_dim in enumerate(mesh_shape.dims):
    if axis in used or mesh_dim.size == 1:
      continue
    free = [n for n in rules.mesh_dimension_name_to_tensor_dimension_names(mesh_dim.name)
            if n not in names]
    if not free:
      continue
    for d in q.shape.dims:
      if (d in unsplittable_dims or d not in k.shape.dims or d not in v.shape.dims
          or d.size % mesh_dim.size):
        continue
      outer = mtf.Dimension(d.name, d.size // mesh_dim.size)
      outer_axis = rules.tensor_dimension_to_mesh_axis(d, mesh_shape)
      if outer_axis is not None and outer.size % mesh_shape.dims[outer_axis].size:
        continue
      new_dims = [outer, mtf.Dimension(free[0], mesh_dim.size)]

      def split(t, d=d, new_dims=new_dims):
        if t is None or d not in t.shape.dims:
          return t
        return mtf.reshape(t, mtf.replace_dimensions(t.shape, d, new_dims))
      return tuple(split(t) for t in unchanged)
  return unchanged


def _combined_dim(dims):
  """One dim named like the first of dims, as large as all of them together."""
  return mtf.Dimension(dims[0].name, mtf.Shape(dims).size)


class AttentionParams:
  """The projection variables of multi-head attention, in the current variable scope.

  With combine_dims=True (the original's checkpoint format) q, k, v are stored as
  [input_dim, heads*d_kv] and o as [heads*d_kv, output_dim], heads the major index and
  the combined dim named like the heads dim (so a layout splitting "heads" splits it).
  memory_heads_dims=[] gives multi-query attention. fold_scaling_into_initializer=True:
  q starts with stddev (d_model * d_kv)**-0.5; with False it starts at d_model**-0.5 and
  compute_q multiplies by d_kv**-0.5.
  """

  def __init__(self, mesh, query_input_dim, memory_input_dim, output_dim, key_dim,
               value_dim, query_heads_dims, memory_heads_dims, variable_dtype,
               shared_kv=False, no_query=False, combine_dims=True, ensemble_dim=None,
               keep_query_heads_dims=False, fold_scaling_into_initializer=True,
               make_attention_vars=True):
    for name, value in list(locals().items()):  # each argument, as its attribute
      if name not in ("self", "ensemble_dim"):
        setattr(self, name, value)
    self.query_heads_dims = list(query_heads_dims or [])
    self.memory_heads_dims = list(memory_heads_dims or [])
    self.ensemble_dims = [ensemble_dim] if ensemble_dim else []
    if shared_kv and key_dim != value_dim:
      raise ShapeError("AttentionParams: shared_kv needs key_dim %s == value_dim %s" % (
          key_dim, value_dim), dim=key_dim.name)
    for d in self.memory_heads_dims:
      if d not in self.query_heads_dims:
        raise ShapeError("AttentionParams: memory heads dim %s is not a query heads dim "
                         "(%s)" % (d, self.query_heads_dims), dim=d.name)
    self.init_weights()

  @property
  def q_dims(self):
    """Dims a projected query gains: query heads then key_dim."""
    return self.query_heads_dims + [self.key_dim]

  @property
  def k_dims(self):
    """Dims a projected key gains: memory heads then key_dim."""
    return self.memory_heads_dims + [self.key_dim]

  @property
  def v_dims(self):
    """Dims a projected value gains: memory heads then value_dim."""
    return self.memory_heads_dims + [self.value_dim]

  @property
  def o_dims(self):
    """Dims the output projection "o" has besides output_dim: query heads, value dim."""
    return self.query_heads_dims + [self.value_dim]

  def _make(self, name, input_dims, output_dims, stddev):
    """Variable `name` over input_dims -> output_dims, reshaped to the separate dims."""
    shape = self.ensemble_dims + input_dims + output_dims
    stored = shape
    if self.combine_dims:
      stored = self.ensemble_dims + [_combined_dim(d) if len(d) > 1 else d[0]
                                     for d in (input_dims, output_dims)]
    var = mtf.get_variable(self.mesh, name, mtf.Shape(stored),
                           initializer=tf.random_normal_initializer(stddev=stddev),
                           dtype=self.variable_dtype)
    if stored == shape:
      return var
    # Keeps dims a Graph.custom_getter put before the stored ones (a pipeline's stages).
    extra = var.shape.dims[:len(var.shape.dims) - len(stored)]
    return mtf.reshape(var, mtf.Shape(extra + shape))

  def init_weights(self):
    """Creates the variables q (unless no_query), k, v (or kv if shared_kv) and o; with
    make_attention_vars=False only o."""
    d_in = self.query_input_dim.size
    if self.fold_scaling_into_initializer:
      q_stddev = (d_in * self.key_dim.size) ** -0.5
    else:
      q_stddev = d_in ** -0.5
    kv_stddev = self.memory_input_dim.size ** -0.5
    o_stddev = mtf.Shape(self.query_heads_dims + [self.value_dim]).size ** -0.5
    self.wq = self.wk = self.wv = self.wkv = None
    if self.make_attention_vars:
      if not self.no_query:
        self.wq = self._make("q", [self.query_input_dim], self.q_dims, q_stddev)
      if self.shared_kv:
        self.wkv = self._make("kv", [self.memory_input_dim], self.k_dims, kv_stddev)
        self.wk = self.wv = self.wkv
      else:
        self.wk = self._make("k", [self.memory_input_dim], self.k_dims, kv_stddev)
        self.wv = self._make("v", [self.memory_input_dim], self.v_dims, kv_stddev)
    self.wo = self._make("o", self.o_dims, [self.output_dim], o_stddev)

  def _project(self, x, w, input_dim, new_dims, what):
    if input_dim not in x.shape.dims:
      raise ShapeError("AttentionParams.%s: input %s %s lacks dim %s" % (
          what, x.name, x.shape, input_dim), tensor=x.name, dim=input_dim.name)
    kept = [d for d in x.shape.dims if d != input_dim]
    out = kept + [d for d in self.ensemble_dims if d not in kept] + new_dims
    return mtf.einsum([x, mtf.cast(w, x.dtype)], output_shape=mtf.Shape(out))

  def compute_q(self, query_antecedent):
    """[batch..., length, d_model] -> [batch..., length, heads, d_kv]."""
    if self.no_query:
      raise ShapeError("AttentionParams.compute_q: built with no_query=True",
                       tensor=query_antecedent.name)
    q = self._project(query_antecedent, self.wq, self.query_input_dim, self.q_dims,
                      "compute_q")
    if not self.fold_scaling_into_initializer:
      q *= self.key_dim.size ** -0.5
    return q

  def compute_k(self, memory_antecedent):
    """[batch..., memory_length, d_model] -> [..., memory heads, d_kv]."""
    return self._project(memory_antecedent, self.wk, self.memory_input_dim, self.k_dims,
                         "compute_k")

  def compute_v(self, memory_antecedent):
    """[batch..., memory_length, d_model] -> [..., memory heads, value dim]."""
    return self._project(memory_antecedent, self.wv, self.memory_input_dim, self.v_dims,
                         "compute_v")

  def compute_kv(self, memory_antecedent):
    """The shared key/value projection (shared_kv=True only)."""
    if not self.shared_kv:
      raise ShapeError("AttentionParams.compute_kv: needs shared_kv=True",
                       tensor=memory_antecedent.name)
    return self.compute_k(memory_antecedent)

  def compute_output(self, o, output_shape=None):
    """Contracts o's heads and value dims with the output projection."""
    for d in self.o_dims:
      if d not in o.shape.dims:
        raise ShapeError("AttentionParams.compute_output: %s %s lacks dim %s" % (
            o.name, o.shape, d), tensor=o.name, dim=d.name)
    if output_shape is None:
      reduced = [self.value_dim] if self.keep_query_heads_dims else self.o_dims
      kept = [d for d in o.shape.dims if d not in reduced]
      output_shape = kept + [d for d in self.ensemble_dims if d not in kept] + [
          self.output_dim]
    return mtf.einsum([o, mtf.cast(self.wo, o.dtype)],
                      output_shape=mtf.convert_to_shape(output_shape))


EXPERT_COMPUTATIONS = ("qkv", "q", "kv")


class ExpertsAttentionParams(AttentionParams):
  """Attention projections computed by a mixture of experts (a Switch/top-2 MoE1D).

  expert_computation "qkv": one MoE1D(use_experts_attention=True) computes the queries
  and the shared keys/values; "q": the queries by the experts, keys/values by the dense
  "kv"; "kv": the reverse, with the dense "q". As in the original, combine_dims and
  shared_kv must be True and the query and key/value heads of one size.
  experts_hparams: an HParams of the ExpertsSelfAttention arguments.
  """

  def __init__(self, mesh, query_input_dim, memory_input_dim, output_dim, key_dim,
               value_dim, query_heads_dims, memory_heads_dims, variable_dtype,
               shared_kv=False, no_query=False, combine_dims=True, ensemble_dim=None,
               keep_query_heads_dims=False, fold_scaling_into_initializer=True,
               context=None, experts_hparams=None, expert_computation="qkv"):
    what = "ExpertsAttentionParams"
    if expert_computation not in EXPERT_COMPUTATIONS:
      raise MtfError("%s: unknown expert_computation %r (choose %s)" % (
          what, expert_computation, EXPERT_COMPUTATIONS), rule=str(expert_computation))
    if not combine_dims or not shared_kv:
      raise MtfError("%s: needs combine_dims=True and shared_kv=True (got %r, %r)" % (
          what, combine_dims, shared_kv), rule="shared_kv")
    if no_query or ensemble_dim is not None:
      raise MtfError("%s: no_query and ensemble_dim are not supported" % what,
                     rule="ensemble_dim")
    if context is None or experts_hparams is None:
      raise MtfError("%s: needs the layer's context and experts_hparams" % what)
    if mtf.layers.unit_scaling_convention():
      raise MtfError("%s: the unit scaling convention is not supported" % what)
    super().__init__(mesh, query_input_dim, memory_input_dim, output_dim, key_dim,
                     value_dim, query_heads_dims, memory_heads_dims, variable_dtype,
                     shared_kv=shared_kv, no_query=no_query, combine_dims=combine_dims,
                     ensemble_dim=ensemble_dim,
                     keep_query_heads_dims=keep_query_heads_dims,
                     fold_scaling_into_initializer=fold_scaling_into_initializer,
                     make_attention_vars=False)
    q_size, kv_size = mtf.Shape(self.q_dims).size, mtf.Shape(self.k_dims).size
    if expert_computation != "q" and q_size != kv_size:
      raise ShapeError("%s: expert_computation %r needs query heads %s and key/value "
                       "heads %s of one size" % (what, expert_computation, self.q_dims,
                                                 self.k_dims), dim="heads")
    self.context = context
    self.experts_hparams = experts_hparams
    self.expert_computation = expert_computation
    if expert_computation == "q":
      self.wkv = self._make("kv", [memory_input_dim], self.k_dims,
                            memory_input_dim.size ** -0.5)
      self.wk = self.wv = self.wkv
    elif expert_computation == "kv":
      stddev = query_input_dim.size ** -0.5
      if fold_scaling_into_initializer:
        stddev *= key_dim.size ** -0.5
      self.wq = self._make("q", [query_input_dim], self.q_dims, stddev)
    # The experts' output dim is called "d_model" (as in the original), so a layout
    # splitting "heads" does not split the experts' output.
    self.moe_output_dim = mtf.Dimension("d_model", q_size)
    from models.transformer import moe  # pylint: disable=g-import-not-at-top
    h = experts_hparams
    self.moe_layer = moe.MoE1D(
        moe_gating=h.moe_gating, num_experts=h.num_experts, loss_coef=h.loss_coef,
        group_size=h.group_size, min_expert_capacity=h.min_expert_capacity,
        capacity_factor_train=h.capacity_factor_train,
        capacity_factor_eval=h.capacity_factor_eval,
        switch_policy_train=h.switch_policy_train,
        switch_policy_eval=h.switch_policy_eval, switch_dropout=h.switch_dropout,
        switch_temperature=h.switch_temperature, switch_jitter=h.switch_jitter,
        ntlb_top_k=h.ntlb_top_k, hidden_size=h.hidden_size,
        output_dim=self.moe_output_dim,
        use_experts_attention=expert_computation == "qkv", activation=h.activation,
        z_loss=h.z_loss)
    self._query_antecedent = self._kv = None
    self._experts_called = False

  def _experts(self, antecedent):
    """The MoE on antecedent ([q, kv] for "qkv"); another memory than the context's
    (the encoder output) is routed without the decoder's padding mask."""
    context = self.context
    with mtf.variable_scope("", reuse=True if self._experts_called else None):
      self._experts_called = True
      if (context.length_dim is None or context.length_dim in antecedent.shape.dims
          or antecedent.shape.ndims < 3):
        return self.moe_layer.call(context, antecedent)
      from models.transformer import moe  # pylint: disable=g-import-not-at-top
      out, loss = moe.transformer_moe_layer_v1(
          antecedent, self.moe_output_dim, self.moe_layer.hparams, context.train,
          context.variable_dtype, layout=context.mesh_layout,
          activation=self.experts_hparams.activation,
          num_microbatches=context.num_microbatches)
      if context.losses is not None:
        context.losses.append(loss)
      return out

  def _split_heads(self, t, heads_dims):
    """[..., d_model(heads*d)] -> [..., heads..., d] (heads-major, like combine_dims)."""
    t = mtf.rename_dimension(t, t.shape.dims[-1].name, heads_dims[0].name)
    return mtf.reshape(t, mtf.Shape(t.shape.dims[:-1] + heads_dims))

  def compute_q(self, query_antecedent):
    """Queries [..., heads, d_kv]; with "qkv" the keys/values of query_antecedent too."""
    if self.expert_computation == "kv":
      return super().compute_q(query_antecedent)
    out = self._experts(query_antecedent)
    if self.expert_computation == "qkv":
      out, kv = out
      self._query_antecedent, self._kv = query_antecedent, kv
    return self._split_heads(out, self.q_dims)

  def compute_kv(self, memory_antecedent):
    """The shared keys/values [..., heads, d_kv] (for "qkv" and memory_antecedent the
    query antecedent: those computed with the queries)."""
    if self.expert_computation == "q":
      return AttentionParams.compute_k(self, memory_antecedent)
    if self.expert_computation == "qkv":
      if memory_antecedent is self._query_antecedent:
        kv = self._kv
      else:
        kv = self._experts(memory_antecedent)[1]
    else:
      kv = self._experts(memory_antecedent)
    return self._split_heads(kv, self.k_dims)

  def compute_k(self, memory_antecedent):
    """The keys: the shared keys/values."""
    return self.compute_kv(memory_antecedent)

  def compute_v(self, memory_antecedent):
    """The values: the shared keys/values."""
    return self.compute_kv(memory_antecedent)


def attention_params_simple(mesh, io_dim, kv_dim, heads_dim, variable_dtype):
  """AttentionParams for plain multi-head attention: d_model in and out, one heads dim."""
  return AttentionParams(mesh, query_input_dim=io_dim, memory_input_dim=io_dim,
                         output_dim=io_dim, key_dim=kv_dim, value_dim=kv_dim,
                         query_heads_dims=[heads_dim], memory_heads_dims=[heads_dim],
                         variable_dtype=variable_dtype)


def _block_length(radius, length_per_split):
  """The largest divisor of length_per_split no larger than max(radius, 128)."""
  block = min(max(radius, 128), length_per_split)
  while length_per_split % block:
    block -= 1
  return block


def local_attention_1d(q, k, v, length_dim, key_dim, value_dim, fully_autoregressive=True,
                       length_dim_num_splits=1, radius=128, sequence_id=1,
                       write_priority=None, read_priority=None, attention_kwargs=None):
  """Attention in which query position p sees memory positions (p - radius, p + radius]
  ((p - radius, p] if fully_autoregressive).

  The length is cut into blocks (a whole number per split of length_dim over
  length_dim_num_splits processors); each block's keys and values gain the neighbouring
  radius positions by a halo exchange. Masked: positions beyond either end, of another
  segment (sequence_id a Tensor [batch..., length_dim]), and memory whose
  write_priority exceeds the query's read_priority. q: [batch..., heads..., length_dim,
  key_dim]; k, v likewise (v None reuses k); attention_kwargs go to attention().
  Returns [batch..., heads..., length_dim, value_dim].
  """
  if length_dim not in q.shape.dims:
    raise ShapeError("local_attention_1d: q %s %s lacks length dim %s" % (
        q.name, q.shape, length_dim), tensor=q.name, dim=length_dim.name)
  if length_dim.size % length_dim_num_splits:
    raise ShapeError("local_attention_1d: %d splits do not divide %s" % (
        length_dim_num_splits, length_dim), dim=length_dim.name)
  mesh = q.mesh
  block = _block_length(radius, length_dim.size // length_dim_num_splits)
  # Named like length_dim, the blocks dim inherits its split; with the split unknown
  # (num_splits 1) another name keeps a length layout rule from splitting it unevenly.
  blocks_name = length_dim.name if length_dim_num_splits > 1 else "local_blocks"
  blocks_dim = mtf.Dimension(blocks_name, length_dim.size // block)
  query_block = mtf.Dimension("query_block_length", block)
  memory_block = mtf.Dimension("memory_block_length", block)
  right = 0 if fully_autoregressive else radius

  def as_query(x):
    return mtf.replace_dimensions(x, length_dim, [blocks_dim, query_block])

  def as_memory(x):
    x = mtf.replace_dimensions(x, length_dim, [blocks_dim, memory_block])
    return halo_exchange_sides(x, blocks_dim, memory_block, radius, right)

  positions = mtf.range(mesh, length_dim, tf.int32)
  query_pos = as_query(positions)
  # Shifted by one so that the zeros the halo exchange pads with mark "no position".
  memory_pos = as_memory(positions + 1) - 1
  memory_block_ext = memory_pos.shape.dims[-1]
  relative = memory_pos - query_pos
  visible = mtf.logical_and(mtf.greater_equal(memory_pos, 0),
                            mtf.logical_and(mtf.greater(relative, -radius),
                                            mtf.less_equal(relative, radius)))
  if fully_autoregressive:
    visible = mtf.logical_and(visible, mtf.less_equal(relative, 0))
  if isinstance(sequence_id, mtf.Tensor):
    visible = mtf.logical_and(visible, mtf.equal(as_query(sequence_id),
                                                 as_memory(sequence_id)))
  if write_priority is not None and read_priority is not None:
    visible = mtf.logical_and(visible, mtf.less_equal(as_memory(write_priority),
                                                      as_query(read_priority)))
  bias = visibility_mask_to_attention_bias(visible, tf.float32)
  q = as_query(q)
  k = as_memory(k)
  v = k if v is None else as_memory(v)
  o = attention(q, k, v, memory_block_ext, key_dim, value_dim, bias=bias,
                **(attention_kwargs or {}))
  return mtf.replace_dimensions(o, [blocks_dim, query_block], length_dim)
