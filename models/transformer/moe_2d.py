"""The two-level mixture of experts: `MoE2D` and `transformer_moe_layer_v2`.

There are expert_x blocks of expert_y experts. An outer top-2 router ("outer_gating")
sends each token of a group to two blocks (at most `capacity_x` tokens of a group per
block); inside each block an inner top-2 router ("inner_gating", one kernel per block)
sends them to two of its experts (capacity_y from moe_capacity_factor_second_level). A
token that reached the block as its second choice has importance 0.5 there and takes
only its inner second choice (the original's rule). Weights: "wi/kernel" [expert_x,
expert_y, d_model, expert_hidden], "wo/kernel" [expert_x, expert_y, expert_hidden,
output_dim]; the loss is the sum of both routers'. The blocks move to the expert layout
(expert_x split like the batch) by one all-to-all, as in MoE1D.
"""
import gin

import mesh_tf as mtf
from mesh_tf.errors import MtfError
from models.transformer import model_layout
from models.transformer import transformer_layer
from models.transformer.moe_gating import (  # pylint: disable=g-multiple-import
    HParams, _check_experts_split, _hidden_dim, _layer_name, _split_into_groups,
    _top_2_gating, expert_capacity)


@gin.configurable(module="moe")
class MoE2D(transformer_layer.TransformerLayer):
  """A two-level (expert_x blocks of expert_y experts) mixture-of-experts layer.

  See the module docstring; the balancing losses go to context.losses.
  """

  def __init__(self, expert_x=8, expert_y=8, loss_coef=1e-2, hidden_size=4096,
               group_size=1024, capacity_factor_train=1.25, capacity_factor_eval=2.0,
               capacity_factor_second_level=1.0, use_second_place_loss=False,
               second_policy_train="random", second_policy_eval="random",
               second_threshold_train=0.2, second_threshold_eval=0.2):
    self._hparams = HParams(
        moe_gating="top_2", moe_num_experts=[expert_x, expert_y],
        moe_loss_coef=loss_coef, moe_hidden_size=hidden_size, moe_group_size=group_size,
        moe_capacity_factor_train=capacity_factor_train,
        moe_capacity_factor_eval=capacity_factor_eval,
        moe_capacity_factor_second_level=capacity_factor_second_level,
        moe_min_expert_capacity=4, moe_use_second_place_loss=use_second_place_loss,
        moe_second_policy_train=second_policy_train,
        moe_second_policy_eval=second_policy_eval,
        moe_second_threshold_train=second_threshold_train,
        moe_second_threshold_eval=second_threshold_eval, moe_dropout_rate=0.0,
        moe_z_loss=None)

  @property
  def hparams(self):
    """The HParams of this layer (moe_num_experts is [expert_x, expert_y])."""
    return self._hparams

  def call(self, context, x, losses=None):
    """Routes each token of x through both levels; returns a Tensor shaped like x."""
    has_length_dim = context.length_dim in x.shape.dims
    if not has_length_dim:
      x = mtf.reshape(x, mtf.Shape(x.shape.dims[:-1] + [mtf.Dimension("length", 1)] +
                                   x.shape.dims[-1:]))
    nonpadding = context.nonpadding if has_length_dim else None
    y, loss = transformer_moe_layer_v2(
        x, x.shape.dims[-1], self._hparams, context.train, context.variable_dtype,
        layout=context.mesh_layout, nonpadding=nonpadding,
        num_microbatches=context.num_microbatches)
    if context.losses is not None:
      context.losses.append(loss)
    if losses is not None:
      losses.append(loss)
    if not has_length_dim:
      y = mtf.reshape(y, mtf.Shape(y.shape.dims[:-2] + y.shape.dims[-1:]))
    return y


def _block_counts(hparams):
  counts = hparams.moe_num_experts
  if (not isinstance(counts, (list, tuple)) or len(counts) != 2
      or not all(isinstance(c, int) and c > 0 for c in counts)):
    raise MtfError("%s: moe_num_experts must be [expert_x, expert_y] (two positive ints) "
                   "for the two-level MoE, got %r" % (_layer_name(), counts),
                   op=_layer_name())
  return counts


def transformer_moe_layer_v2(inputs, output_dim, hparams, train, variable_dtype,
                             layout=None, mesh_shape=None, nonpadding=None,
                             num_microbatches=None):
  """A two-level mixture-of-experts layer on inputs [batch, ..., d_model].

  Args:
    inputs: mtf Tensor whose first dim is the batch dim and last the model dim.
    output_dim: the mtf.Dimension of the output's last dim.
    hparams: HParams with the moe_* fields; moe_num_experts is [expert_x, expert_y].
    train: whether training (capacity factors, second-expert policy, dropout).
    variable_dtype: mtf.VariableDType of the variables.
    layout, mesh_shape: the layout rules and mesh shape the graph is lowered with (or
      the MeshLayout as layout).
    nonpadding: optional float Tensor [batch..., length], 1.0 at real tokens.
    num_microbatches: the loss is divided by it when the batch is a microbatch.

  Returns:
    (output shaped like inputs with output_dim last, scalar loss of both routers).
  """
  orig_dims = inputs.shape.dims
  batch_and_length_dims, input_dim = orig_dims[:-1], orig_dims[-1]
  num_x, num_y = _block_counts(hparams)
  x_dim, y_dim = mtf.Dimension("expert_x", num_x), mtf.Dimension("expert_y", num_y)
  mesh_layout = model_layout.mesh_layout_of(layout, mesh_shape)
  _check_experts_split(x_dim, mesh_layout)
  _check_experts_split(y_dim, mesh_layout)
  hidden_dim = _hidden_dim(hparams)
  batch_dim = orig_dims[0]
  mesh_dim_size = model_layout.split_size(mesh_layout, batch_dim)
  n = inputs.shape.size // input_dim.size
  num_groups, group_size = _split_into_groups(n, hparams.moe_group_size, mesh_dim_size)
  groups_dim = mtf.Dimension(batch_dim.name, num_groups)
  groups_unsplit = mtf.Dimension("batch_unsplit", num_groups)
  group_dim = mtf.Dimension("group", group_size)
  inputs = mtf.reshape(inputs, [groups_dim, group_dim, input_dim])
  if nonpadding is not None:
    nonpadding = mtf.zeros(inputs.mesh, batch_and_length_dims, dtype=inputs.dtype) + (
        mtf.cast(nonpadding, inputs.dtype))
    nonpadding = mtf.reshape(nonpadding, [groups_dim, group_dim])

  factor = hparams.moe_capacity_factor_train if train else hparams.moe_capacity_factor_eval
  capacity_x = mtf.Dimension("expert_capacity_x", expert_capacity(
      group_size, factor, num_x, hparams.moe_min_expert_capacity))
  capacity_y = mtf.Dimension("expert_capacity_y", expert_capacity(
      capacity_x.size, hparams.moe_capacity_factor_second_level, num_y,
      hparams.moe_min_expert_capacity))
  x_unsplit = mtf.Dimension("expert_x_unsplit", num_x)

  dispatch_x, combine_x, loss_outer = _top_2_gating(
      inputs, None, x_unsplit, capacity_x, hparams, train, variable_dtype,
      importance=nonpadding, name="outer_gating", num_microbatches=num_microbatches)
  # [groups, x_unsplit, capacity_x, m] -> [x, groups_unsplit, capacity_x, m].
  block_inputs = mtf.einsum([inputs, dispatch_x], output_shape=[
      x_unsplit, groups_dim, capacity_x, input_dim])
  block_inputs = mtf.reshape(block_inputs, [x_dim, groups_unsplit, capacity_x,
                                                input_dim])
  # 1.0 where a block slot holds a first choice, 0.5 a second choice, 0.0 nothing.
  slot_gate = mtf.reduce_sum(combine_x, output_shape=[x_unsplit, groups_dim, capacity_x])
  importance = 0.5 * (mtf.to_float(mtf.greater(slot_gate, 0.5)) +
                      mtf.to_float(mtf.greater(slot_gate, 0.0)))
  importance = mtf.reshape(mtf.cast(importance, inputs.dtype),
                               [x_dim, groups_unsplit, capacity_x])

  dispatch_y, combine_y, loss_inner = _top_2_gating(
      block_inputs, [x_dim], y_dim, capacity_y, hparams, train, variable_dtype,
      importance=importance, name="inner_gating", num_microbatches=num_microbatches)
  expert_inputs = mtf.einsum([block_inputs, dispatch_y], output_shape=[
      x_dim, y_dim, groups_unsplit, capacity_y, input_dim])
  h = mtf.layers.dense(expert_inputs, hidden_dim, reduced_dims=[input_dim],
                       expert_dims=[x_dim, y_dim], activation=mtf.relu, use_bias=False,
                       variable_dtype=variable_dtype, name="wi")
  if hparams.get("moe_dropout_rate"):
    h = mtf.dropout(h, is_training=train, rate=hparams.moe_dropout_rate)
  expert_output = mtf.layers.dense(h, output_dim, reduced_dims=[hidden_dim],
                                   expert_dims=[x_dim, y_dim], use_bias=False,
                                   variable_dtype=variable_dtype, name="wo")
  block_output = mtf.einsum([expert_output, combine_y], output_shape=[
      x_dim, groups_unsplit, capacity_x, output_dim])
  block_output = mtf.reshape(block_output, [x_unsplit, groups_dim, capacity_x,
                                                output_dim])
  output = mtf.einsum([block_output, combine_x], output_shape=[
      groups_dim, group_dim, output_dim])
  output = mtf.reshape(output, batch_and_length_dims + [output_dim])
  return output, loss_outer + loss_inner
