"""Experts attention: self- and encoder-decoder attention whose query and key/value
projections are a mixture of experts (attention.ExpertsAttentionParams), offered (and
gin-configurable) as transformer_layers.ExpertsSelfAttention / .ExpertsEncDecAttention.
"""
import gin

from mesh_tf.errors import MtfError
from models.transformer import attention
from models.transformer import core_layers as tl
from models.transformer.context import incremental_aware
from models.transformer.moe_gating import HParams


@gin.configurable(module="transformer_layers")
class ExpertsSelfAttention(tl.SelfAttention):
  """Self-attention whose projections are computed by experts (Switch routing by
  default): expert_computation "qkv" (queries and the shared keys/values from one MoE
  with a shared hidden layer), "q" or "kv" (the other one dense).

  The MoE arguments are MoE1D's; **kwargs are SelfAttention's (shared_kv=True is
  required, as in the original). Variables under "ExpertsSelfAttention/": the router
  "<moe_gating>_gating/kernel", "wi/kernel" [experts, d_model, expert_hidden],
  "q_wo/kernel" and "k_wo/kernel" [experts, expert_hidden, heads*d_kv] ("qkv"), the
  dense "q" or "kv" otherwise, and "o".
  """

  def __init__(self, num_experts=16, loss_coef=1e-2, group_size=1024,
               capacity_factor_train=1.25, capacity_factor_eval=2.0, moe_gating="switch",
               min_expert_capacity=4, switch_policy_train="input_jitter",
               switch_policy_eval="input_jitter", switch_dropout=0.0,
               switch_temperature=1.0, switch_jitter=1e-2, ntlb_top_k=4, hidden_size=3072,
               activation="relu", z_loss=None, expert_computation="qkv", **kwargs):
    super().__init__(**kwargs)
    if expert_computation not in attention.EXPERT_COMPUTATIONS:
      raise MtfError("%s: unknown expert_computation %r (choose %s)" % (
          type(self).__name__, expert_computation, attention.EXPERT_COMPUTATIONS),
                     rule=str(expert_computation))
    self.expert_computation = expert_computation
    self._hparams = HParams(
        moe_gating=moe_gating, num_experts=num_experts, loss_coef=loss_coef,
        group_size=group_size, min_expert_capacity=min_expert_capacity,
        capacity_factor_train=capacity_factor_train,
        capacity_factor_eval=capacity_factor_eval,
        switch_policy_train=switch_policy_train, switch_policy_eval=switch_policy_eval,
        switch_dropout=switch_dropout, switch_temperature=switch_temperature,
        switch_jitter=switch_jitter, ntlb_top_k=ntlb_top_k, hidden_size=hidden_size,
        activation=activation, z_loss=z_loss)

  @property
  def experts_hparams(self):
    """The HParams handed to ExpertsAttentionParams."""
    return self._hparams

  def make_params(self, context, io_dim=None, memory_dim=None):
    """The layer's ExpertsAttentionParams (creates its variables in the current scope)."""
    model_dim = io_dim or tl._model_dim(context)  # pylint: disable=protected-access
    query_heads, memory_heads = tl._heads_dims(  # pylint: disable=protected-access
        self.num_heads, self.num_memory_heads, type(self).__name__)
    return attention.ExpertsAttentionParams(
        context.mesh, query_input_dim=model_dim,
        memory_input_dim=memory_dim or model_dim, output_dim=model_dim,
        key_dim=self.kv_dim, value_dim=self.kv_dim, query_heads_dims=query_heads,
        memory_heads_dims=memory_heads, variable_dtype=context.variable_dtype,
        shared_kv=self.shared_kv, no_query=False, ensemble_dim=None,
        combine_dims=self.combine_dims, keep_query_heads_dims=self.keep_query_heads_dims,
        fold_scaling_into_initializer=self.fold_scaling_into_initializer,
        context=context, experts_hparams=self._hparams,
        expert_computation=self.expert_computation)

  def compute_qkv(self, context, params, x):
    """Queries and keys/values of x from one MoE call, then the keys/values' length
    renamed "memory_length"."""
    q = params.compute_q(x)
    kv = self.rename_length_to_memory_length(params.compute_kv(x), context)
    return q, kv, kv


@gin.configurable(module="transformer_layers")
class ExpertsEncDecAttention(ExpertsSelfAttention):
  """Encoder-decoder attention with experts projections: the queries of x, the keys
  and values of context.encoder_output (with "qkv" and "kv" the encoder output is
  routed through the same experts; their balancing losses both go to context.losses).
  Variables under "ExpertsEncDecAttention/"."""

  def __init__(self, relative_attention_type=None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  _get_memory_antecedent = tl.EncDecAttention._get_memory_antecedent  # pylint: disable=protected-access
  supports_incremental_decoding = tl.EncDecAttention.supports_incremental_decoding

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] attends to the encoder output; returns x's shape."""
    with tl.class_scope(self):
      return tl.enc_dec_attention(self, self._get_memory_antecedent(context), context, x,
                                  losses, attention_fn=self.attention_fn)
