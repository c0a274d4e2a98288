"""reversible_half_residual_and_swap (mesh_tf/layers/reversible.py): forward values and
gradients of a stack of RevNet blocks against the plain computation in TF, and the
backward contract (rebuilt activations flow through the backwards tensors)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import FOCUSED_CASES, FOCUSED_IDS, check_layer
from mtf_testing import BATCH, HIDDEN, new_mesh, random_array

SHAPE = [BATCH, HIDDEN]
MID = mtf.Dimension("mid", 8)
NUM_BLOCKS = 3


def _mtf_stack(x1, x2, recompute_grads):
  """NUM_BLOCKS blocks, each f a small feed-forward net with its own weights."""
  x1_backwards = x2_backwards = None
  for i in range(NUM_BLOCKS):
    def f(t, i=i):
      return mtf.tanh(mtf.layers.dense_relu_dense(t, MID, False, name="f%d" % i))
    x1, x1_backwards, x2, x2_backwards = mtf.layers.reversible_half_residual_and_swap(
        x1, x1_backwards, x2, x2_backwards, f, recompute_grads=recompute_grads)
  return [x1, x2]


def _tf_stack(x1, x2, params):
  for i in range(NUM_BLOCKS):
    hidden = tf.nn.relu(tf.einsum("bh,hm->bm", x2, params["f%d/wi/kernel" % i]))
    fx = tf.tanh(tf.einsum("bm,mh->bh", hidden, params["f%d/wo/kernel" % i]))
    x1, x2 = x2, x1 + fx
  return [x1, x2]


@pytest.mark.parametrize("recompute_grads", [True, False], ids=["recompute", "plain"])
@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_reversible_stack_matches_plain_tf(make_mesh_impl, case, recompute_grads):
  inputs = [(random_array(SHAPE, 31), SHAPE), (random_array(SHAPE, 32), SHAPE)]
  check_layer(make_mesh_impl(*case), inputs,
              lambda a, b: _mtf_stack(a, b, recompute_grads),
              lambda xs, p: _tf_stack(xs[0], xs[1], p), rtol=1e-4, atol=1e-5)


def test_reversible_stack_on_one_input_used_twice(make_mesh_impl):
  """Both halves start as the same tensor: its gradient sums both paths."""
  check_layer(make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols"),
              [(random_array(SHAPE, 33), SHAPE)],
              lambda x: mtf.add(*_mtf_stack(x, x, True)),
              lambda xs, p: tf.add(*_tf_stack(xs[0], xs[0], p)), rtol=1e-4, atol=1e-5)


def test_backward_pass_rebuilds_inputs_from_what_the_next_block_sends(make_mesh_impl):
  """The gradients sent to the backwards inputs are the rebuilt x1 = y - f(x2) and x2,
  from the values arriving on the backwards outputs; f' is taken at that rebuilt x2,
  not at the forward x2."""
  values = {name: random_array(SHAPE, seed) for seed, name in enumerate(
      ["x1", "x1b", "x2", "x2b", "g_x2", "r_x2", "g_y", "r_y"], 40)}
  graph, mesh = new_mesh()
  t = {name: mtf.import_tf_tensor(mesh, v, SHAPE) for name, v in values.items()}
  outs = mtf.layers.reversible_half_residual_and_swap(t["x1"], t["x1b"], t["x2"],
                                                      t["x2b"], mtf.tanh)
  grads = mtf.gradients(list(outs), [t["x1"], t["x2"], t["x1b"], t["x2b"]],
                        grad_ys=[t["g_x2"], t["r_x2"], t["g_y"], t["r_y"]])
  lowering = mtf.Lowering(graph, {mesh: make_mesh_impl("rows:2;cols:4",
                                                       "batch:rows;hidden:cols")})
  got = [lowering.export_to_tf_tensor(g).numpy() for g in list(outs) + grads]
  v = values
  forward_y = v["x1"] + np.tanh(v["x2"])
  expected = [v["x2"], v["x2"], forward_y, forward_y,
              v["g_y"], v["g_x2"] + v["g_y"] * (1 - np.tanh(v["r_x2"]) ** 2),
              v["r_y"] - np.tanh(v["r_x2"]), v["r_x2"]]
  names = ["y1", "y1_backwards", "y2", "y2_backwards", "d x1", "d x2", "rebuilt x1",
           "rebuilt x2"]
  for name, g, e in zip(names, got, expected):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=name)


def test_reversible_bad_inputs_name_the_dim():
  _, mesh = new_mesh()
  x = mtf.zeros(mesh, SHAPE)
  other = mtf.zeros(mesh, [BATCH, MID])
  with pytest.raises(mtf.ShapeError, match="x2 .* must have the shape") as info:
    mtf.layers.reversible_half_residual_and_swap(x, None, other, None, mtf.tanh)
  assert info.value.dim == "mid"
  with pytest.raises(mtf.ShapeError, match="x1_backwards"):
    mtf.layers.reversible_half_residual_and_swap(x, other, x, None, mtf.tanh)
  with pytest.raises(mtf.ShapeError, match="f\\(x2\\)") as info:
    mtf.layers.reversible_half_residual_and_swap(
        x, None, x, None, lambda t: mtf.layers.dense(t, MID, use_bias=False, name="g"))
  assert info.value.dim == "mid"
