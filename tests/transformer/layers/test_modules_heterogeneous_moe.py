"""HeterogeneousMoE1D: experts of different widths and depth, forward and every
gradient against plain TF (routing decided token by token in numpy), on one device and
dp+mp layouts (placement, SIMD emulation); the expert masks; bad mask descriptions."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from test_modules_moe import (  # pylint: disable=g-multiple-import
    D_MODEL, _check_against_tf, _run, _var, tf_top_2)
from models.transformer import heterogeneous_moe as hm

HIDDEN = 8
WIDTHS = [2, 2, 8, 8]


def _layer(**kwargs):
  options = dict(num_experts=4, hidden_size=HIDDEN, group_size=8,
                 capacity_factor_eval=1.0, min_expert_capacity=1,
                 second_policy_eval="all", moe_num_layers=2,
                 heterogeneous_mask_info="2:2,2:8")
  options.update(kwargs)
  return hm.HeterogeneousMoE1D(**options)


def _build(layer, layout=None, mesh_shape=None):
  def build(xt):
    return hm.transformer_moe_layer_v1(xt, xt.shape.dims[-1], layer.hparams, False,
                                       mtf.VariableDType(tf.float32), layout=layout,
                                       mesh_shape=mesh_shape)
  return build


def tf_heterogeneous(x, v):
  mask = (np.arange(HIDDEN)[None, :] < np.array(WIDTHS)[:, None]).astype(np.float32)
  xg = tf.reshape(x, [4, 8, D_MODEL.size])
  dispatch, combine, loss = tf_top_2(xg, v[_var(v, "top_2_gating/kernel")], 2)
  expert_in = tf.einsum("gsd,gsec->egcd", xg, dispatch)
  h = tf.nn.relu(tf.einsum("egcd,edh->egch", expert_in, v[_var(v, "wi/kernel")]))
  h *= mask[:, None, None, :]
  h = tf.nn.relu(tf.einsum("egch,ehk->egck", h, v[_var(v, "wh_0/kernel")]))
  h *= mask[:, None, None, :]
  out = tf.einsum("egch,eho->egco", h, v[_var(v, "wo/kernel")])
  return tf.reshape(tf.einsum("egco,gsec->gso", out, combine), x.shape), loss


@pytest.fixture(scope="module")
def single():
  x = np.random.RandomState(6).normal(size=(4, 8, 8)).astype(np.float32)
  values, full, w = _run(_build(_layer()), x, mtf_testing.backend_mesh_impl("placement", "", ""))
  return x, values, full, w


def test_heterogeneous_experts_match_tf(single):
  x, values, full, w = single
  assert full[_var(full, "wh_0/kernel")].shape == (4, HIDDEN, HIDDEN)
  _check_against_tf(values, full, x, w, tf_heterogeneous)
  # Units past an expert's width get no gradient.
  d_wi = values["d/" + _var(full, "wi/kernel")]
  assert not np.any(d_wi[:2, :, 2:]) and np.any(d_wi[2:, :, 2:])


@pytest.mark.parametrize("backend,mesh_shape,layout", [
    ("placement", "rows:2;cols:4", "batch:rows;experts:rows;expert_hidden:cols"),
    ("simd", "rows:2;cols:4", "batch:rows;experts:cols")], ids=["placement", "simd"])
def test_heterogeneous_experts_do_not_depend_on_layout(single, backend, mesh_shape,
                                                       layout):
  x, ref, full, _ = single
  got, _, _ = _run(_build(_layer(), layout, mesh_shape), x,
                   mtf_testing.backend_mesh_impl(backend, mesh_shape, layout), weights=full)
  for key in ref:
    np.testing.assert_allclose(got[key], ref[key], rtol=2e-4, atol=2e-5, err_msg=key)


def test_masks_and_their_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  experts, hidden = mtf.Dimension("experts", 3), mtf.Dimension("expert_hidden", 4)
  mask = hm.generate_heterogeneous_expert_masks([[1, 1], [2, 4]], 3, experts, mesh,
                                                hidden)
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl("placement", "", "")})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(mask).numpy(),
                                [[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
  with pytest.raises(mtf.MtfError, match="describes 2 experts, but there are 3"):
    hm.generate_heterogeneous_expert_masks("1:2,1:4", 3, experts, mesh, hidden)
  with pytest.raises(mtf.MtfError, match=r"widths must be in \[1, 4\]"):
    hm.generate_heterogeneous_expert_masks("3:5", 3, experts, mesh, hidden)
  with pytest.raises(mtf.MtfError, match="expected 'count:width"):
    _layer(heterogeneous_mask_info="two:8")
