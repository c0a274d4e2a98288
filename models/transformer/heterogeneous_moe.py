"""Mixture of experts with experts of different sizes: `HeterogeneousMoE1D`.

Routing is MoE1D's. The experts share one weight layout ([experts, d_model,
expert_hidden] for "wi", ...), but expert e uses only the first width_e units of the
hidden dim: its hidden activations are multiplied by a 0/1 mask [experts,
expert_hidden] (`generate_heterogeneous_expert_masks`). heterogeneous_mask_info gives
the widths as (count, width) pairs in expert order, e.g. [[2, 64], [2, 256]] or the
string "2:64,2:256"; None gives every expert the full width. moe_num_layers > 1 adds
moe_num_layers - 1 hidden-to-hidden layers "wh_<i>" (masked the same way) per expert.
"""
import gin
import numpy as np

import mesh_tf as mtf
from models.transformer import model_layout
from models.transformer import moe


def _parse_mask_info(mask_info):
  if isinstance(mask_info, str):
    try:
      return [tuple(int(v) for v in part.split(":")) for part in mask_info.split(",")]
    except ValueError:
      raise mtf.MtfError("heterogeneous_mask_info %r: expected 'count:width,...'"
                         % mask_info) from None
  return [tuple(pair) for pair in mask_info]


def generate_heterogeneous_expert_masks(mask_info, num_experts, experts_dim, mesh,
                                        expert_width):
  """A float [experts_dim, expert_width] Tensor: 1.0 on the first width_e hidden units
  of expert e (widths from mask_info, see the module docstring), 0.0 elsewhere."""
  specs = _parse_mask_info(mask_info)
  widths = [width for count, width in specs for _ in range(count)]
  if len(widths) != num_experts:
    raise mtf.MtfError("heterogeneous_mask_info %r describes %d experts, but there are "
                       "%d" % (mask_info, len(widths), num_experts), dim=experts_dim.name)
  if any(w < 1 or w > expert_width.size for w in widths):
    raise mtf.MtfError("heterogeneous_mask_info %r: widths must be in [1, %d] (the expert "
                       "hidden size)" % (mask_info, expert_width.size),
                       dim=expert_width.name)
  mask = (np.arange(expert_width.size)[None, :] <
          np.array(widths)[:, None]).astype(np.float32)
  return mtf.constant(mesh, mask, mtf.Shape([experts_dim, expert_width]))


def _hidden_activation(activation):
  if isinstance(activation, (list, tuple)):
    return mtf.relu
  if isinstance(activation, str):
    return mtf.relu if activation == "relu" else getattr(mtf, activation)
  return activation


def _heterogeneous_experts(expert_inputs, experts_dim, hidden_dim, output_dim, hparams,
                           train, variable_dtype, activation):
  """moe.expert_network with masked hidden units and moe_num_layers layers."""
  mask_info = hparams.get("moe_heterogeneous_mask_info")
  mask = None
  if mask_info is not None:
    mask = generate_heterogeneous_expert_masks(
        mask_info, experts_dim.size, experts_dim, expert_inputs.mesh, hidden_dim)
  masked = lambda h: h if mask is None else h * mtf.cast(mask, h.dtype)
  h = masked(mtf.layers.dense_product(
      expert_inputs, reduced_dims=expert_inputs.shape.dims[-1:], new_dims=[hidden_dim],
      expert_dims=[experts_dim], activation_functions=activation, use_bias=False,
      variable_dtype=variable_dtype, name="wi"))
  inner = mtf.Dimension(hidden_dim.name + "_in", hidden_dim.size)
  for i in range(hparams.get("moe_num_layers", 1) - 1):
    h = mtf.rename_dimension(h, hidden_dim.name, inner.name)
    h = masked(mtf.layers.dense(h, hidden_dim, reduced_dims=[inner],
                                expert_dims=[experts_dim], use_bias=False,
                                activation=_hidden_activation(activation),
                                variable_dtype=variable_dtype, name="wh_%d" % i))
  if hparams.moe_dropout_rate:
    h = mtf.dropout(h, is_training=train, rate=hparams.moe_dropout_rate)
  return mtf.layers.dense(h, output_dim, expert_dims=[experts_dim], use_bias=False,
                          reduced_dims=[hidden_dim], variable_dtype=variable_dtype,
                          name="wo")


def transformer_moe_layer_v1(inputs, output_dim, hparams, train, variable_dtype,
                             layout=None, mesh_shape=None, nonpadding=None,
                             activation=mtf.relu, num_microbatches=None,
                             token_embeddings=None, context=None):
  """moe.transformer_moe_layer_v1 with heterogeneous experts (hparams
  moe_heterogeneous_mask_info, moe_num_layers). context is accepted for the original's
  signature; nothing here reads it."""
  del context
  if hparams.get("moe_num_layers", 1) < 1:
    raise mtf.MtfError("heterogeneous MoE: moe_num_layers must be at least 1, got %r"
                       % hparams.moe_num_layers)
  return moe.moe_layer_with_experts(
      inputs, output_dim, hparams, train, variable_dtype,
      model_layout.mesh_layout_of(layout, mesh_shape), nonpadding, activation,
      num_microbatches, token_embeddings, _heterogeneous_experts)


@gin.configurable(module="heterogeneous_moe")
class HeterogeneousMoE1D(moe.MoE1D):
  """MoE1D whose experts differ in width (and may be deeper); see the module docstring.
  Parameters are MoE1D's plus moe_num_layers and heterogeneous_mask_info."""

  def __init__(self, num_experts=16, loss_coef=1e-2, hidden_size=4096, group_size=1024,
               capacity_factor_train=1.25, capacity_factor_eval=2.0, use_second_place_loss=False,
               second_policy_train="random", second_policy_eval="random",
               second_threshold_train=0.2, second_threshold_eval=0.2, dropout_rate=0.0,
               activation="relu", moe_gating="top_2", min_expert_capacity=4,
               switch_policy_train="input_jitter", switch_policy_eval="input_jitter",
               switch_dropout=0.1, switch_temperature=1.0, switch_jitter=1e-2, ntlb_top_k=4,
               output_dim=None, z_loss=None, word_embed_mode=None,
               use_second_place_expert_prob=None, use_second_place_expert_prob_temp=None,
               moe_num_layers=1, heterogeneous_mask_info=None, top_n_num_experts_per_token=3):
    moe1d_args = dict(locals())  # the arguments alone: nothing else is bound yet
    for own in ("self", "__class__", "moe_num_layers", "heterogeneous_mask_info"):
      del moe1d_args[own]
    super().__init__(**moe1d_args)
    if heterogeneous_mask_info is not None:
      _parse_mask_info(heterogeneous_mask_info)  # fail early on a malformed string
    self._hparams.add_hparam("moe_num_layers", moe_num_layers)
    self._hparams.add_hparam("moe_heterogeneous_mask_info", heterogeneous_mask_info)

  def _moe_layer(self, context, *args, **kwargs):
    return transformer_moe_layer_v1(*args, context=context, **kwargs)
