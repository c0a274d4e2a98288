"""Mixture of experts (the original's transformer/moe.py): `MoE1D`, `MoE2D` and their layers.

Tokens are cut into groups of group_size (the groups dim takes the batch dim's name, so
the batch's layout rule splits it). A router (moe_gating.py) picks experts per token in
each group; an expert takes at most `expert_capacity` tokens of a group, dropping the
rest. Dispatch and combine are one-hot [groups, group, experts, capacity] einsums, and
tokens move between the token and expert layouts with an all-to-all (mtf.reshape).
MoE2D / transformer_moe_layer_v2 live in moe_2d.py.
"""
import gin

import mesh_tf as mtf
from mesh_tf.errors import MtfError, ShapeError
from models.transformer import model_layout
from models.transformer import transformer_layer
from models.transformer.moe_gating import (  # pylint: disable=unused-import,g-multiple-import
    HParams, _check_experts_split, _hidden_dim, _layer_name, _split_into_groups,
    _switch_gating, _top_2_gating, expert_capacity, routing_inputs,
    set_default_moe_hparams)
from models.transformer.moe_2d import MoE2D, transformer_moe_layer_v2  # pylint: disable=unused-import


@gin.configurable(module="moe")
class MoE1D(transformer_layer.TransformerLayer):
  """A mixture-of-experts feed-forward layer (GShard-style top-2, or Switch top-1).

  Parameters are the original's. With word_embed_mode "add" or "concat" the router also
  reads context.input_embeddings. Variables: "wi/kernel" [experts, d_model,
  expert_hidden], "wo/kernel" [experts, expert_hidden, output_dim] and the router
  "<gating>_gating/kernel"; the balancing loss goes to context.losses. With
  use_experts_attention=True (ExpertsAttentionParams) the experts have "q_wo" and "k_wo"
  instead of "wo", and call returns the list [queries, keys/values].
  """

  def __init__(self, num_experts=16, loss_coef=1e-2, hidden_size=4096, group_size=1024,
               capacity_factor_train=1.25, capacity_factor_eval=2.0,
               use_second_place_loss=False, second_policy_train="random",
               second_policy_eval="random", second_threshold_train=0.2,
               second_threshold_eval=0.2, dropout_rate=0.0, activation="relu",
               moe_gating="top_2", min_expert_capacity=4,
               switch_policy_train="input_jitter", switch_policy_eval="input_jitter",
               switch_dropout=0.1, switch_temperature=1.0, switch_jitter=1e-2,
               ntlb_top_k=4, output_dim=None, use_experts_attention=False, z_loss=None,
               word_embed_mode=None, use_second_place_expert_prob=None,
               use_second_place_expert_prob_temp=None, top_n_num_experts_per_token=3):
    if use_second_place_expert_prob is not None:
      raise MtfError("MoE1D: use_second_place_expert_prob=%r is not supported; choose "
                     "the second expert with second_policy_train/eval" % (
                         use_second_place_expert_prob,))
    self._hparams = HParams(
        moe_gating=moe_gating, moe_num_experts=num_experts, moe_loss_coef=loss_coef,
        moe_hidden_size=hidden_size, moe_group_size=group_size,
        moe_capacity_factor_train=capacity_factor_train,
        moe_capacity_factor_eval=capacity_factor_eval,
        moe_min_expert_capacity=min_expert_capacity,
        moe_use_second_place_loss=use_second_place_loss,
        moe_second_policy_train=second_policy_train,
        moe_second_policy_eval=second_policy_eval,
        moe_second_threshold_train=second_threshold_train,
        moe_second_threshold_eval=second_threshold_eval, moe_dropout_rate=dropout_rate,
        moe_switch_policy_train=switch_policy_train,
        moe_switch_policy_eval=switch_policy_eval, moe_switch_dropout=switch_dropout,
        moe_switch_temperature=switch_temperature, moe_switch_jitter=switch_jitter,
        moe_ntlb_top_k=ntlb_top_k, moe_output_dim=output_dim, moe_z_loss=z_loss,
        moe_word_embed_mode=word_embed_mode,
        moe_use_second_place_expert_prob=use_second_place_expert_prob,
        moe_use_second_place_expert_prob_temp=use_second_place_expert_prob_temp,
        moe_top_n_num_experts_per_token=top_n_num_experts_per_token,
        moe_use_experts_attention=use_experts_attention)
    self._activation = activation

  @property
  def hparams(self):
    """The HParams of this layer (moe_* names, as transformer_moe_layer_v1 reads them)."""
    return self._hparams

  def call(self, context, x, losses=None):
    """Routes each token of x to its experts; returns a Tensor shaped like x (with
    use_experts_attention a list of two, their last dim the output dim)."""
    has_length_dim = context.length_dim in x.shape.dims
    if not has_length_dim:
      # Incremental decoding passes one position: give it a length dim of size 1.
      x = mtf.reshape(x, mtf.Shape(x.shape.dims[:-1] + [mtf.Dimension("length", 1)] +
                                   x.shape.dims[-1:]))
    output_dim = self._hparams.moe_output_dim
    if output_dim is None:
      output_dim = getattr(context.model, "model_dim", None) or x.shape.dims[-1]
    elif isinstance(output_dim, int):
      output_dim = mtf.Dimension("d_model", output_dim)
    nonpadding = context.nonpadding
    if nonpadding is not None and not has_length_dim:
      nonpadding = None
    token_embeddings = None
    if self._hparams.moe_word_embed_mode is not None:
      token_embeddings = getattr(context, "input_embeddings", None)
      if token_embeddings is not None and not has_length_dim:
        token_embeddings = mtf.reshape(token_embeddings, x.shape)
    y, loss = self._moe_layer(
        context, x, output_dim, self._hparams, context.train, context.variable_dtype,
        layout=context.mesh_layout, nonpadding=nonpadding,
        activation=self._activation, num_microbatches=context.num_microbatches,
        token_embeddings=token_embeddings)
    if context.losses is not None:
      context.losses.append(loss)
    if losses is not None:
      losses.append(loss)
    if not has_length_dim:
      drop_length = lambda t: mtf.reshape(t, mtf.Shape(t.shape.dims[:-2] +
                                                       t.shape.dims[-1:]))
      y = [drop_length(t) for t in y] if isinstance(y, list) else drop_length(y)
    return y

  def _moe_layer(self, context, *args, **kwargs):
    """The layer function (HeterogeneousMoE1D swaps in its own)."""
    del context
    return transformer_moe_layer_v1(*args, **kwargs)


def _expert_outputs(output_names, expert_inputs, experts_dim, hidden_dim, output_dim,
                    hparams, train, variable_dtype, activation):
  """activation(x wi) per expert, dropout, then one per-expert projection per name."""
  h = mtf.layers.dense_product(
      expert_inputs, reduced_dims=expert_inputs.shape.dims[-1:], new_dims=[hidden_dim],
      expert_dims=[experts_dim], activation_functions=activation, use_bias=False,
      variable_dtype=variable_dtype, name="wi")
  if hparams.moe_dropout_rate:
    h = mtf.dropout(h, is_training=train, rate=hparams.moe_dropout_rate)
  return [mtf.layers.dense(h, output_dim, expert_dims=[experts_dim], use_bias=False,
                           reduced_dims=h.shape.dims[-1:], variable_dtype=variable_dtype,
                           name=name) for name in output_names]


def expert_network(expert_inputs, experts_dim, hidden_dim, output_dim, hparams, train,
                   variable_dtype, activation):
  """Every expert's feed-forward net on its inputs [..., experts, ..., d_model]:
  activation(x wi) wo with per-expert "wi/kernel" and "wo/kernel"."""
  return _expert_outputs(["wo"], expert_inputs, experts_dim, hidden_dim, output_dim,
                         hparams, train, variable_dtype, activation)[0]


def experts_attention_network(expert_inputs, experts_dim, hidden_dim, output_dim,
                              hparams, train, variable_dtype, activation):
  """The experts of experts attention: one hidden layer "wi" shared by the queries and
  the keys/values, then "q_wo" and "k_wo"; returns [queries, keys/values]."""
  return _expert_outputs(["q_wo", "k_wo"], expert_inputs, experts_dim, hidden_dim,
                         output_dim, hparams, train, variable_dtype, activation)


def transformer_moe_layer_v1(inputs, output_dim, hparams, train, variable_dtype,
                             layout=None, mesh_shape=None, nonpadding=None,
                             activation=mtf.relu, num_microbatches=None,
                             token_embeddings=None):
  """A mixture-of-experts layer on inputs [outer_batch?, batch, ..., d_model].

  Args:
    inputs: mtf Tensor; the first dim (or the second, after an "outer_batch" dim) is the
      batch dim, the last is the model dim.
    output_dim: the mtf.Dimension of the output's last dim.
    hparams: HParams with the moe_* fields of set_default_moe_hparams.
    train: whether training (capacity factor, second-expert policy, dropout, noise).
    variable_dtype: mtf.VariableDType of the variables.
    layout, mesh_shape: the layout rules and mesh shape the graph will be lowered with
      (or the MeshLayout as layout); the number of groups is made a multiple of the
      mesh dim splitting the batch.
    nonpadding: optional float Tensor [batch..., length], 1.0 at real tokens; padding
      tokens are routed nowhere and left out of the balancing loss.
    activation: the experts' activation (a function, an op name, or a list for a gated
      product of several "wi_<i>" projections).
    num_microbatches: the loss is divided by it when the batch is a microbatch.
    token_embeddings: optional Tensor shaped like inputs, the embedded input tokens;
      with hparams.moe_word_embed_mode "add" or "concat" the router reads them too.

  Returns:
    (output shaped like inputs with output_dim last, scalar loss: balancing loss times
    moe_loss_coef, plus the router z-loss when moe_z_loss is set). With
    hparams.moe_use_experts_attention the output is the list [queries, keys/values]
    (experts_attention_network).
  """
  experts = (experts_attention_network if hparams.get("moe_use_experts_attention")
             else expert_network)
  return moe_layer_with_experts(
      inputs, output_dim, hparams, train, variable_dtype,
      mesh_layout=model_layout.mesh_layout_of(layout, mesh_shape), nonpadding=nonpadding,
      activation=activation, num_microbatches=num_microbatches,
      token_embeddings=token_embeddings, experts=experts)


def moe_layer_with_experts(inputs, output_dim, hparams, train, variable_dtype,
                           mesh_layout, nonpadding, activation, num_microbatches,
                           token_embeddings, experts):
  """transformer_moe_layer_v1 (layout a MeshLayout or None) with the experts given:
  experts(expert_inputs, experts_dim, hidden_dim, output_dim, hparams, train,
  variable_dtype, activation) -> a Tensor or a list of them (a list out)."""
  orig_dims = inputs.shape.dims
  batch_and_length_dims, input_dim = orig_dims[:-1], orig_dims[-1]
  hidden_dim = _hidden_dim(hparams)
  experts_dim = mtf.Dimension("experts", hparams.moe_num_experts)
  _check_experts_split(experts_dim, mesh_layout)
  if orig_dims[0].name == "outer_batch":
    outer_batch_dim, orig_batch_dim = orig_dims[:2]
  else:
    outer_batch_dim, orig_batch_dim = mtf.Dimension("outer_batch", 1), orig_dims[0]

  n = inputs.shape.size // input_dim.size // outer_batch_dim.size
  mesh_dim_size = model_layout.split_size(mesh_layout, orig_batch_dim)
  num_groups, group_size = _split_into_groups(n, hparams.moe_group_size, mesh_dim_size)
  group_size_dim = mtf.Dimension("group", group_size)
  num_groups_dim = mtf.Dimension(orig_batch_dim.name, num_groups)
  moe_input_dims = [outer_batch_dim, num_groups_dim, group_size_dim, input_dim]
  inputs = mtf.reshape(inputs, moe_input_dims)

  capacity_factor = (hparams.moe_capacity_factor_train if train else
                     hparams.moe_capacity_factor_eval)
  capacity_dim = mtf.Dimension("expert_capacity", expert_capacity(
      group_size, capacity_factor, experts_dim.size, hparams.moe_min_expert_capacity))
  experts_dim_unsplit = mtf.Dimension("expert_unsplit", experts_dim.size)
  groups_dim_unsplit = mtf.Dimension("batch_unsplit", num_groups)

  if nonpadding is not None:
    nonpadding = mtf.zeros(inputs.mesh, batch_and_length_dims, dtype=inputs.dtype) + (
        mtf.cast(nonpadding, inputs.dtype))
    nonpadding = mtf.reshape(nonpadding, moe_input_dims[:-1])
  gating = {"top_2": _top_2_gating, "switch": _switch_gating}.get(hparams.moe_gating)
  if gating is None:
    raise MtfError("%s: unknown moe_gating %r (choose 'top_2' or 'switch')" % (
        _layer_name(), hparams.moe_gating), op=_layer_name())
  gate_inputs = inputs
  if hparams.get("moe_word_embed_mode") is not None:
    if token_embeddings is not None:
      if token_embeddings.shape.dims != orig_dims:
        raise ShapeError("%s: token_embeddings %s must have the shape of the inputs %s"
                         % (_layer_name(), token_embeddings.shape, mtf.Shape(orig_dims)),
                         op=_layer_name(), tensor=token_embeddings.name)
      token_embeddings = mtf.reshape(token_embeddings, moe_input_dims)
    gate_inputs = routing_inputs(inputs, token_embeddings, hparams.moe_word_embed_mode)
  dispatch_tensor, combine_tensor, loss = gating(
      inputs=gate_inputs, outer_expert_dims=None, experts_dim=experts_dim_unsplit,
      expert_capacity_dim=capacity_dim, hparams=hparams, train=train,
      variable_dtype=variable_dtype, importance=nonpadding,
      num_microbatches=num_microbatches)

  # Token layout -> expert layout: [o, e_unsplit, groups, c, m] -> [o, e, g_unsplit, c, m].
  expert_inputs = mtf.einsum([inputs, dispatch_tensor], output_shape=mtf.Shape(
      [outer_batch_dim, experts_dim_unsplit, num_groups_dim, capacity_dim, input_dim]))
  expert_inputs = mtf.reshape(expert_inputs, mtf.Shape(
      [outer_batch_dim, experts_dim, groups_dim_unsplit, capacity_dim, input_dim]))

  expert_outputs = experts(expert_inputs, experts_dim, hidden_dim, output_dim, hparams,
                           train, variable_dtype, activation)

  def to_tokens(expert_output):
    # Expert layout -> token layout, then weight each expert's answer by its gate.
    expert_output = mtf.reshape(expert_output, mtf.Shape(
        [outer_batch_dim, experts_dim_unsplit, num_groups_dim, capacity_dim, output_dim]))
    output = mtf.einsum([expert_output, combine_tensor], output_shape=mtf.Shape(
        moe_input_dims[:-1] + [output_dim]))
    return mtf.reshape(output, batch_and_length_dims + [output_dim])
  if isinstance(expert_outputs, list):
    return [to_tokens(t) for t in expert_outputs], loss
  return to_tokens(expert_outputs), loss

