"""Mixture of experts (the original's transformer/moe.py): `MoE1D` and its MoE layer.

Tokens are cut into groups (a "group" dim of group_size tokens; the number of groups is a
multiple of the mesh dim that splits the batch, and takes the batch dim's name so the same
layout rule splits it). A router picks experts per token inside each group (top-2 or
Switch top-1 gating); each expert takes at most `expert_capacity` tokens of a group and
the rest are dropped for that expert. Dispatch and combine are one-hot tensors
[groups, group, experts, capacity] built from cumulative-sum positions, applied with
einsums. Between the token layout (groups split) and the expert layout (experts split)
the tokens move with an all-to-all when both use the same mesh dim (moe_relayout.py).

The load-balancing loss is num_experts**2 * mean over (groups, experts) of
(fraction of the group's tokens whose first choice is e) * (mean router probability of
e), which is 1.0 when routing is uniform, times loss_coef.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import LayoutError, MtfError, ShapeError
from mesh_tf.graph.graph import current_scope_name
from models.transformer import transformer_layer
from models.transformer.moe_relayout import relayout_rename, reshape_keeping_splits


class HParams:
  """A bag of named hyperparameters (stands in for tf.contrib.training.HParams)."""

  def __init__(self, **kwargs):
    for name, value in kwargs.items():
      setattr(self, name, value)

  def add_hparam(self, name, value):
    """Adds a new hyperparameter; raises MtfError if it exists already."""
    if hasattr(self, name):
      raise MtfError("HParams: hyperparameter %r already exists" % name)
    setattr(self, name, value)

  def set_hparam(self, name, value):
    """Changes an existing hyperparameter; raises MtfError if it does not exist."""
    if not hasattr(self, name):
      raise MtfError("HParams: no hyperparameter %r" % name)
    setattr(self, name, value)

  def get(self, name, default=None):
    """The value of name, or default."""
    return getattr(self, name, default)

  def values(self):
    """A dict of every hyperparameter."""
    return dict(vars(self))

  def __contains__(self, name):
    return hasattr(self, name)

  def __repr__(self):
    return "HParams(%s)" % ", ".join("%s=%r" % kv for kv in sorted(vars(self).items()))


_DEFAULT_MOE_HPARAMS = dict(
    moe_gating="top_2",
    moe_num_experts=16,
    moe_loss_coef=1e-2,
    moe_hidden_size=4096,
    moe_group_size=1024,
    moe_capacity_factor_train=1.25,
    moe_capacity_factor_eval=2.0,
    moe_capacity_factor_second_level=1.0,
    moe_min_expert_capacity=4,
    moe_use_second_place_loss=False,
    moe_second_policy_train="random",
    moe_second_policy_eval="random",
    moe_second_threshold_train=0.2,
    moe_second_threshold_eval=0.2,
    moe_dropout_rate=0.0,
    moe_switch_policy_train="input_jitter",
    moe_switch_policy_eval="input_jitter",
    moe_switch_dropout=0.1,
    moe_switch_temperature=1.0,
    moe_switch_jitter=1e-2,
    moe_ntlb_top_k=4,
    moe_output_dim=None,
    moe_z_loss=None,
)


def set_default_moe_hparams(hparams):
  """Adds every moe_* hyperparameter with its default value to hparams; returns it."""
  for name, value in _DEFAULT_MOE_HPARAMS.items():
    hparams.add_hparam(name, value)
  return hparams


@gin.configurable(module="moe")
class MoE1D(transformer_layer.TransformerLayer):
  """A mixture-of-experts feed-forward layer (GShard-style top-2, or Switch top-1).

  Each expert is a ReLU (or `activation`) feed-forward net d_model -> hidden_size ->
  output_dim with its own weights: variables "wi/kernel" [experts, d_model,
  expert_hidden] and "wo/kernel" [experts, expert_hidden, output_dim], plus the router
  "<gating>_gating/kernel". The balancing loss goes to context.losses.
  """

  def __init__(self, num_experts=16, loss_coef=1e-2, hidden_size=4096, group_size=1024,
               capacity_factor_train=1.25, capacity_factor_eval=2.0,
               use_second_place_loss=False, second_policy_train="random",
               second_policy_eval="random", second_threshold_train=0.2,
               second_threshold_eval=0.2, dropout_rate=0.0, moe_gating="top_2",
               min_expert_capacity=4, switch_policy_train="input_jitter",
               switch_policy_eval="input_jitter", switch_dropout=0.1,
               switch_temperature=1.0, switch_jitter=1e-2, ntlb_top_k=4, output_dim=None,
               use_experts_attention=False, activation="relu", z_loss=None):
    if use_experts_attention:
      raise MtfError("MoE1D: use_experts_attention=True is not supported; use the "
                     "attention layers' own experts variants")
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
        moe_ntlb_top_k=ntlb_top_k, moe_output_dim=output_dim, moe_z_loss=z_loss)
    self._activation = activation

  @property
  def hparams(self):
    """The HParams of this layer (moe_* names, as transformer_moe_layer_v1 reads them)."""
    return self._hparams

  def call(self, context, x, losses=None):
    """Routes each token of x to its experts; returns a Tensor shaped like x."""
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
    y, loss = transformer_moe_layer_v1(
        x, output_dim, self._hparams, context.train, context.variable_dtype,
        layout=getattr(context.model, "layout", None),
        mesh_shape=getattr(context.model, "mesh_shape", None), nonpadding=nonpadding,
        activation=self._activation, num_microbatches=context.num_microbatches)
    if context.losses is not None:
      context.losses.append(loss)
    if losses is not None:
      losses.append(loss)
    if not has_length_dim:
      y = mtf.reshape(y, mtf.Shape(y.shape.dims[:-2] + y.shape.dims[-1:]))
    return y


def _layer_name():
  return current_scope_name() or "transformer_moe_layer_v1"


def _split_into_groups(n, max_group_size, mesh_dim_size):
  """(num_groups, group_size) with num_groups a multiple of mesh_dim_size dividing n.

  Takes the fewest groups of at most max_group_size tokens (when possible) that meet
  both conditions.
  """
  if n % mesh_dim_size != 0:
    raise LayoutError(
        "%s: %d tokens per batch cannot be cut into a multiple of %d groups (the size of "
        "the mesh dim splitting the batch)" % (_layer_name(), n, mesh_dim_size),
        op=_layer_name(), dim="batch")
  num_groups = max(1, n // max_group_size)
  while num_groups % mesh_dim_size != 0 or n % num_groups != 0:
    num_groups += 1
  return num_groups, n // num_groups


def _check_experts_split(experts_dim, layout, mesh_shape):
  """Raises LayoutError when the layout splits experts over a mesh dim not dividing it."""
  if layout is None or mesh_shape is None:
    return
  rules = mtf.convert_to_layout_rules(layout)
  mesh = mtf.convert_to_shape(mesh_shape)
  axis = rules.tensor_dimension_to_mesh_axis(experts_dim, mesh)
  if axis is not None and experts_dim.size % mesh[axis].size != 0:
    raise LayoutError(
        "%s: num_experts=%d is not divisible by mesh dim %s of size %d, which the layout "
        "rule %s:%s splits it over" % (
            _layer_name(), experts_dim.size, mesh[axis].name, mesh[axis].size,
            experts_dim.name, mesh[axis].name),
        op=_layer_name(), dim=experts_dim.name, mesh_dim=mesh[axis].name,
        rule="%s:%s" % (experts_dim.name, mesh[axis].name))


def _hidden_dim(hparams):
  size = hparams.get("moe_hidden_size")
  if not isinstance(size, int) or size <= 0:
    raise ShapeError("%s: the expert hidden dim (moe_hidden_size / MoE1D hidden_size) "
                     "must be a positive int, got %r" % (_layer_name(), size),
                     op=_layer_name(), dim="expert_hidden")
  return mtf.Dimension("expert_hidden", size)


def expert_capacity(group_size, capacity_factor, num_experts, min_expert_capacity):
  """Tokens each expert takes from one group: min(group, int(group * factor / experts)),
  raised to min_expert_capacity."""
  capacity = min(group_size, int((group_size * capacity_factor) / num_experts))
  return max(capacity, min_expert_capacity)


def transformer_moe_layer_v1(inputs, output_dim, hparams, train, variable_dtype,
                             layout=None, mesh_shape=None, nonpadding=None,
                             activation=mtf.relu, num_microbatches=None):
  """A mixture-of-experts layer on inputs [outer_batch?, batch, ..., d_model].

  Args:
    inputs: mtf Tensor; the first dim (or the second, after an "outer_batch" dim) is the
      batch dim, the last is the model dim.
    output_dim: the mtf.Dimension of the output's last dim.
    hparams: HParams with the moe_* fields of set_default_moe_hparams.
    train: whether training (capacity factor, second-expert policy, dropout, noise).
    variable_dtype: mtf.VariableDType of the variables.
    layout, mesh_shape: the layout rules and mesh shape the graph will be lowered with;
      the number of groups is made a multiple of the mesh dim splitting the batch.
    nonpadding: optional float Tensor [batch..., length], 1.0 at real tokens; padding
      tokens are routed nowhere and left out of the balancing loss.
    activation: the experts' activation (a function, an op name, or a list for a gated
      product of several "wi_<i>" projections).
    num_microbatches: the loss is divided by it when the batch is a microbatch.

  Returns:
    (output shaped like inputs with output_dim last, scalar loss: balancing loss times
    moe_loss_coef, plus the router z-loss when moe_z_loss is set).
  """
  orig_dims = inputs.shape.dims
  batch_and_length_dims, input_dim = orig_dims[:-1], orig_dims[-1]
  hidden_dim = _hidden_dim(hparams)
  experts_dim = mtf.Dimension("experts", hparams.moe_num_experts)
  _check_experts_split(experts_dim, layout, mesh_shape)
  if orig_dims[0].name == "outer_batch":
    outer_batch_dim, orig_batch_dim = orig_dims[:2]
  else:
    outer_batch_dim, orig_batch_dim = mtf.Dimension("outer_batch", 1), orig_dims[0]

  n = inputs.shape.size // input_dim.size // outer_batch_dim.size
  mesh_dim_size = 1
  if layout is not None and mesh_shape is not None:
    mesh_dim_size = mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, orig_batch_dim)
  num_groups, group_size = _split_into_groups(n, hparams.moe_group_size, mesh_dim_size)
  group_size_dim = mtf.Dimension("group", group_size)
  num_groups_dim = mtf.Dimension(orig_batch_dim.name, num_groups)
  moe_input_dims = [outer_batch_dim, num_groups_dim, group_size_dim, input_dim]
  inputs = reshape_keeping_splits(inputs, moe_input_dims)

  capacity_factor = (hparams.moe_capacity_factor_train if train else
                     hparams.moe_capacity_factor_eval)
  capacity_dim = mtf.Dimension("expert_capacity", expert_capacity(
      group_size, capacity_factor, experts_dim.size, hparams.moe_min_expert_capacity))
  experts_dim_unsplit = mtf.Dimension("expert_unsplit", experts_dim.size)
  groups_dim_unsplit = mtf.Dimension("batch_unsplit", num_groups)

  if nonpadding is not None:
    nonpadding = mtf.zeros(inputs.mesh, batch_and_length_dims, dtype=inputs.dtype) + (
        mtf.cast(nonpadding, inputs.dtype))
    nonpadding = reshape_keeping_splits(nonpadding, moe_input_dims[:-1])
  gating = {"top_2": _top_2_gating, "switch": _switch_gating}.get(hparams.moe_gating)
  if gating is None:
    raise MtfError("%s: unknown moe_gating %r (choose 'top_2' or 'switch')" % (
        _layer_name(), hparams.moe_gating), op=_layer_name())
  dispatch_tensor, combine_tensor, loss = gating(
      inputs=inputs, outer_expert_dims=None, experts_dim=experts_dim_unsplit,
      expert_capacity_dim=capacity_dim, hparams=hparams, train=train,
      variable_dtype=variable_dtype, importance=nonpadding,
      num_microbatches=num_microbatches)

  # Token layout -> expert layout: [o, e_unsplit, groups, c, m] -> [o, e, g_unsplit, c, m].
  expert_inputs = mtf.einsum([inputs, dispatch_tensor], output_shape=mtf.Shape(
      [outer_batch_dim, experts_dim_unsplit, num_groups_dim, capacity_dim, input_dim]))
  expert_inputs = relayout_rename(expert_inputs, mtf.Shape(
      [outer_batch_dim, experts_dim, groups_dim_unsplit, capacity_dim, input_dim]))

  h = mtf.layers.dense_product(
      expert_inputs, reduced_dims=expert_inputs.shape.dims[-1:], new_dims=[hidden_dim],
      expert_dims=[experts_dim], activation_functions=activation, use_bias=False,
      variable_dtype=variable_dtype, name="wi")
  if hparams.moe_dropout_rate:
    h = mtf.dropout(h, is_training=train, rate=hparams.moe_dropout_rate)
  expert_output = mtf.layers.dense(
      h, output_dim, expert_dims=[experts_dim], use_bias=False,
      reduced_dims=h.shape.dims[-1:], variable_dtype=variable_dtype, name="wo")

  # Expert layout -> token layout, then weight each expert's answer by its gate.
  expert_output = relayout_rename(expert_output, mtf.Shape(
      [outer_batch_dim, experts_dim_unsplit, num_groups_dim, capacity_dim, output_dim]))
  output = mtf.einsum([expert_output, combine_tensor], output_shape=mtf.Shape(
      moe_input_dims[:-1] + [output_dim]))
  output = reshape_keeping_splits(output, batch_and_length_dims + [output_dim])
  return output, loss


def _choice_mask(index, gate, raw_gates, experts_dim, importance):
  """(one-hot of the chosen expert, its gate, the density proxy), zero on padding."""
  mask = mtf.one_hot(index, experts_dim, dtype=tf.float32)
  density_proxy = raw_gates
  if importance is not None:
    real = _real_token_mask(importance)
    mask *= real
    gate *= real
    density_proxy *= real
  return mask, gate, density_proxy


def _top_1(x, dim):
  """(index, value) of the max of x over dim (the first index on ties)."""
  return mtf.argmax(x, dim), mtf.reduce_max(x, reduced_dim=dim)


def _real_token_mask(importance):
  return mtf.to_float(mtf.equal(importance, 1.0))


def _balance_loss(mask_1, gates, group_size_dim, experts_dim):
  """E**2 * mean(fraction routed to e * mean gate of e): 1.0 under uniform routing."""
  density = mtf.reduce_mean(mask_1, reduced_dim=group_size_dim)
  density_proxy = mtf.reduce_mean(gates, reduced_dim=group_size_dim)
  return mtf.reduce_mean(density_proxy * density) * float(experts_dim.size ** 2)


def _z_loss(gate_logits, experts_dim, importance):
  """Mean over real tokens of logsumexp(router logits)**2 (keeps the logits small)."""
  z = mtf.square(mtf.reduce_logsumexp(mtf.to_float(gate_logits), experts_dim))
  if importance is None:
    return mtf.reduce_mean(z)
  real = _real_token_mask(importance)
  return mtf.reduce_sum(z * real) / (mtf.reduce_sum(real) + 1e-9)


def _scaled_loss(balance, gate_logits, experts_dim, hparams, importance, num_microbatches,
                 dtype):
  loss = balance * hparams.moe_loss_coef
  if hparams.get("moe_z_loss"):
    loss += _z_loss(gate_logits, experts_dim, importance) * hparams.moe_z_loss
  if num_microbatches and num_microbatches > 1:
    loss /= num_microbatches
  return mtf.cast(loss, dtype)


def _positions(mask, group_size_dim, experts_dim, capacity, offset=None):
  """Position of each routed token in its expert's buffer, and the mask of those that fit.

  mask: 0/1 [..., group, experts]. Returns (position [..., group] (float), mask with
  the tokens beyond capacity removed, that mask summed over experts [..., group]).
  """
  position = mtf.cumsum(mask, group_size_dim, exclusive=True)
  if offset is not None:
    position += offset
  position *= mask
  mask *= mtf.to_float(mtf.less(position, float(capacity)))
  return (mtf.reduce_sum(position, reduced_dim=experts_dim), mask,
          mtf.reduce_sum(mask, reduced_dim=experts_dim))


def _slot(index, position, experts_dim, capacity_dim):
  """One-hot [..., group, experts, capacity] of (expert index, position in its buffer)."""
  return (mtf.one_hot(index, experts_dim, dtype=tf.float32) *
          mtf.one_hot(mtf.to_int32(position), capacity_dim, dtype=tf.float32))


def _second_expert_mask(mask_2, gate_2, hparams, train):
  """Applies the second-expert policy ("all", "none", "threshold", "random")."""
  policy = hparams.moe_second_policy_train if train else hparams.moe_second_policy_eval
  threshold = (hparams.moe_second_threshold_train if train else
               hparams.moe_second_threshold_eval)
  if policy == "all":
    return mask_2
  if policy == "none":
    return mtf.zeros_like(mask_2)
  if policy == "threshold":
    return mask_2 * mtf.to_float(mtf.greater(gate_2, threshold))
  if policy == "random":
    # Dispatch to the second expert with probability gate_2 / threshold.
    noise = mtf.random_uniform(gate_2.mesh, gate_2.shape, name="second_expert_noise")
    return mask_2 * mtf.to_float(mtf.less(noise, gate_2 / max(threshold, 1e-9)))
  raise MtfError("%s: unknown second-expert policy %r (choose 'all', 'none', "
                 "'threshold' or 'random')" % (_layer_name(), policy), op=_layer_name())


def _top_2_gating(inputs, outer_expert_dims, experts_dim, expert_capacity_dim, hparams,
                  train, variable_dtype, importance=None, name="top_2_gating",
                  num_microbatches=None):
  """Top-2 routing of inputs [..., groups, group, d_model].

  Returns (dispatch, combine, loss): dispatch is 0/1 and combine holds the normalized
  gate weights, both [..., groups, group, experts, expert_capacity].
  """
  group_size_dim = inputs.shape.dims[-2]
  gate_logits = mtf.layers.dense(inputs, experts_dim, use_bias=False,
                                 expert_dims=outer_expert_dims,
                                 variable_dtype=variable_dtype, name=name)
  raw_gates = mtf.to_float(mtf.softmax(gate_logits, experts_dim))
  capacity = expert_capacity_dim.size

  index_1, gate_1 = _top_1(raw_gates, experts_dim)
  mask_1, gate_1, density_1_proxy = _choice_mask(index_1, gate_1, raw_gates, experts_dim,
                                                 importance)
  gates_without_top_1 = raw_gates * (1.0 - mask_1)
  index_2, gate_2 = _top_1(gates_without_top_1, experts_dim)
  mask_2 = mtf.one_hot(index_2, experts_dim, dtype=tf.float32)
  if importance is not None:
    mask_2 *= mtf.to_float(mtf.greater(importance, 0.0))
  denom = gate_1 + gate_2 + 1e-9
  gate_1 /= denom
  gate_2 /= denom

  balance = _balance_loss(mask_1, density_1_proxy, group_size_dim, experts_dim)
  if hparams.moe_use_second_place_loss:
    # Also balance the second choices, weighted by how often they are kept.
    balance += 0.5 * _balance_loss(mask_2, gates_without_top_1, group_size_dim,
                                   experts_dim)
  loss = _scaled_loss(balance, gate_logits, experts_dim, hparams, importance,
                      num_microbatches, inputs.dtype)

  mask_2 = _second_expert_mask(mask_2, gate_2, hparams, train)
  position_1, mask_1, mask_1_flat = _positions(mask_1, group_size_dim, experts_dim,
                                               capacity)
  # Second choices queue behind every first choice of the group.
  mask_1_count = mtf.reduce_sum(mask_1, reduced_dim=group_size_dim)
  position_2, mask_2, mask_2_flat = _positions(mask_2, group_size_dim, experts_dim,
                                               capacity, offset=mask_1_count)
  slot_1 = mask_1_flat * _slot(index_1, position_1, experts_dim, expert_capacity_dim)
  slot_2 = mask_2_flat * _slot(index_2, position_2, experts_dim, expert_capacity_dim)
  combine = gate_1 * slot_1 + gate_2 * slot_2
  dispatch = slot_1 + slot_2
  return (mtf.cast(dispatch, inputs.dtype), mtf.cast(combine, inputs.dtype), loss)


def _switch_gating(inputs, outer_expert_dims, experts_dim, expert_capacity_dim, hparams,
                   train, variable_dtype, importance=None, name="switch_gating",
                   num_microbatches=None):
  """Switch (top-1) routing of inputs [..., groups, group, d_model]; see _top_2_gating.

  Policies (moe_switch_policy_train/eval): "argmax"; "input_jitter" (inputs times
  uniform noise in 1 +- moe_switch_jitter) and "input_dropout" (dropout of rate
  moe_switch_dropout) while training; "sample" (an expert drawn from the router's
  softmax at moe_switch_temperature while training).
  """
  group_size_dim = inputs.shape.dims[-2]
  policy = hparams.moe_switch_policy_train if train else hparams.moe_switch_policy_eval
  if policy not in ("argmax", "input_jitter", "input_dropout", "sample"):
    raise MtfError("%s: unknown switch policy %r (choose 'argmax', 'input_jitter', "
                   "'input_dropout' or 'sample')" % (_layer_name(), policy),
                   op=_layer_name())
  router_inputs = inputs
  if train and policy == "input_jitter":
    jitter = hparams.moe_switch_jitter
    router_inputs *= mtf.random_uniform(inputs.mesh, inputs.shape, minval=1.0 - jitter,
                                        maxval=1.0 + jitter, dtype=inputs.dtype,
                                        name="switch_jitter")
  elif train and policy == "input_dropout":
    router_inputs = mtf.dropout(inputs, is_training=True, rate=hparams.moe_switch_dropout)
  gate_logits = mtf.layers.dense(router_inputs, experts_dim, use_bias=False,
                                 expert_dims=outer_expert_dims,
                                 variable_dtype=variable_dtype, name=name)
  raw_gates = mtf.to_float(mtf.softmax(gate_logits, experts_dim))
  if train and policy == "sample":
    index = mtf.sample_with_temperature(gate_logits, experts_dim,
                                        hparams.moe_switch_temperature)
    gate = mtf.reduce_sum(raw_gates * mtf.one_hot(index, experts_dim, dtype=tf.float32),
                          reduced_dim=experts_dim)
  else:
    index, gate = _top_1(raw_gates, experts_dim)
  mask, gate, density_proxy = _choice_mask(index, gate, raw_gates, experts_dim,
                                           importance)
  balance = _balance_loss(mask, density_proxy, group_size_dim, experts_dim)
  loss = _scaled_loss(balance, gate_logits, experts_dim, hparams, importance,
                      num_microbatches, inputs.dtype)
  position, mask, mask_flat = _positions(mask, group_size_dim, experts_dim,
                                         expert_capacity_dim.size)
  slot = mask_flat * _slot(index, position, experts_dim, expert_capacity_dim)
  return (mtf.cast(slot, inputs.dtype), mtf.cast(gate * slot, inputs.dtype), loss)
