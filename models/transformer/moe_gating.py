"""The routing half of the mixture-of-experts layers (shared by moe.py and moe_2d.py):
the moe_* hyperparameters, groups, and the top-2 (GShard) and Switch gatings, which
return dispatch and combine tensors [..., groups, group, experts, expert_capacity] and
the load-balancing loss (1.0 under uniform routing) times loss_coef.
"""
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import LayoutError, MtfError, ShapeError
from mesh_tf.graph.graph import current_scope_name



class HParams:
  """A bag of named hyperparameters (stands in for tf.contrib.training.HParams)."""

  def __init__(self, **kwargs):
    for name, value in kwargs.items():
      setattr(self, name, value)

  def add_hparam(self, k, v):
    """Adds the new hyperparameter k with value v; raises MtfError if k exists."""
    if hasattr(self, k):
      raise MtfError("HParams: hyperparameter %r already exists" % k)
    setattr(self, k, v)

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
    moe_word_embed_mode=None,
    moe_use_second_place_expert_prob=None,
    moe_use_second_place_expert_prob_temp=None,
    moe_top_n_num_experts_per_token=3,
    moe_use_experts_attention=False,
)


def set_default_moe_hparams(hparams):
  """Adds every moe_* hyperparameter with its default value to hparams; returns it."""
  for name, value in _DEFAULT_MOE_HPARAMS.items():
    hparams.add_hparam(name, value)
  return hparams


def _layer_name():
  return current_scope_name() or "transformer_moe_layer_v1"


def _split_into_groups(n, max_group_size, mesh_dim_size):
  """(num_groups, group_size): the fewest groups (of at most max_group_size tokens when
  possible), num_groups a multiple of mesh_dim_size dividing n."""
  if n % mesh_dim_size != 0:
    raise LayoutError(
        "%s: %d tokens per batch cannot be cut into a multiple of %d groups (the size of "
        "the mesh dim splitting the batch)" % (_layer_name(), n, mesh_dim_size),
        op=_layer_name(), dim="batch")
  num_groups = max(1, n // max_group_size)
  while num_groups % mesh_dim_size != 0 or n % num_groups != 0:
    num_groups += 1
  return num_groups, n // num_groups


def _check_experts_split(experts_dim, mesh_layout):
  """Raises LayoutError when the layout splits experts over a mesh dim not dividing it."""
  if mesh_layout is None:
    return
  mesh = mesh_layout.shape
  axis = mesh_layout.tensor_dimension_to_mesh_axis(experts_dim)
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


def routing_inputs(inputs, token_embeddings, word_embed_mode):
  """What the router reads for word_embed_mode None (inputs), "add" (inputs +
  token_embeddings) or "concat" (both side by side along the model dim)."""
  if word_embed_mode is None:
    return inputs
  if token_embeddings is None:
    raise MtfError("%s: moe_word_embed_mode=%r needs token_embeddings (the embedded "
                   "input tokens), got None" % (_layer_name(), word_embed_mode),
                   op=_layer_name())
  if token_embeddings.shape != inputs.shape:
    raise ShapeError("%s: token_embeddings %s must have the shape of the inputs %s" % (
        _layer_name(), token_embeddings.shape, inputs.shape), op=_layer_name(),
                     tensor=token_embeddings.name)
  token_embeddings = mtf.cast(token_embeddings, inputs.dtype)
  if word_embed_mode == "add":
    return inputs + token_embeddings
  if word_embed_mode == "concat":
    return mtf.concat([inputs, token_embeddings], inputs.shape.dims[-1].name)
  raise MtfError("%s: unknown moe_word_embed_mode %r (choose None, 'add' or 'concat')"
                 % (_layer_name(), word_embed_mode), op=_layer_name())


def expert_capacity(group_size, capacity_factor, num_experts, min_expert_capacity):
  """Tokens each expert takes from one group: min(group, int(group * factor / experts)),
  raised to min_expert_capacity."""
  capacity = min(group_size, int((group_size * capacity_factor) / num_experts))
  return max(capacity, min_expert_capacity)



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
  """(position [..., group] of each routed token in its expert's buffer, mask [...,
  group, experts] without the tokens beyond capacity, that mask summed over experts)."""
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
  """Top-2 routing of inputs [..., groups, group, d_model]: (dispatch (0/1), combine
  (the normalized gate weights), loss), both [..., groups, group, experts, capacity]."""
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
  """Switch (top-1) routing; see _top_2_gating. Policies: "argmax", and while training
  "input_jitter" (inputs times uniform noise in 1 +- moe_switch_jitter),
  "input_dropout" or "sample" (from the router's softmax at moe_switch_temperature)."""
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
