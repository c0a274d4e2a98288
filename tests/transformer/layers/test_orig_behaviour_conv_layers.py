"""Issue 32, items 2 and 4: the convolution layers of transformer_layers behave as the
original's: they need no context.variable_dtype (the original's never read it; their
variables take float32 masters and the input's dtype), the first_part and incremental
states and `update_state` (which honours its position argument) match numpy, the
glorot-uniform filter of Conv1DLayer comes from tf.compat.v1.glorot_uniform_initializer
looked up at call time, and an output dim named like the input dim (d_model:6 ->
d_model:2) works in every mode."""
import collections
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import test_utils
from models.transformer import transformer
from models.transformer import transformer_layers

B, D, F = 2, 6, 3
BareContext = collections.namedtuple("Context", ["inputs", "activation_dtype", "mode"])


def _decoder_context(conv, length=4, mode="incremental", initial_position=None,
                     state=None, inputs=None):
  batch_dim, length_dim = mtf.Dimension("batch", B), mtf.Dimension("length", length)
  model = transformer.Unitransformer(
      d_model=D, input_vocab_size=10, output_vocab_size=10, autoregressive=True,
      max_length=length, layer_stack=transformer.LayerStack(layers=[]))
  states = None
  if state is not None:
    states = [conv.convert_np_array_to_mtf_tensor(
        state, dtype=tf.float32, dim_names=["batch", "length", "d_model"])]
  if initial_position:
    initial_position = mtf.constant(conv.mesh, initial_position,
                                    shape=mtf.Shape([batch_dim]), dtype=tf.int32)
  if inputs is not None:
    inputs = conv.convert_np_array_to_mtf_tensor(inputs, dim_names=["batch", "length"])
  return transformer.Context(
      model=model, mode=mode, states=states, new_states=[], mesh=conv.mesh,
      batch_dims=[batch_dim], length_dim=length_dim,
      variable_dtype=mtf.VariableDType(tf.float32), sequence_id=1, inputs=inputs,
      initial_position=initial_position)


def _f32(conv, x, names):
  return conv.convert_np_array_to_mtf_tensor(x, dtype=tf.float32, dim_names=names)


def _variables(conv, out):
  lowering, value = conv.convert_mtf_tensor_to_tf_tensor(out)
  params = {v.name: laid.read_full().numpy() for v, laid in lowering.variables.items()}
  return value.numpy(), params, lowering


@pytest.mark.parametrize("output_size", [D, 2])
def test_conv1d_layer_without_context_variable_dtype(output_size):
  conv = test_utils.NumpyConverter()
  rng = np.random.RandomState(0)
  ids = np.array([[3, 4, 0], [1, 0, 0]])
  x = rng.randn(B, 3, D).astype(np.float32)
  context = BareContext(conv.convert_np_array_to_mtf_tensor(ids, dim_names=["batch",
                                                                            "length"]),
                        tf.float32, "train")
  out = transformer_layers.Conv1DLayer(filter_size=3, output_size=output_size).call(
      context, _f32(conv, x, ["batch", "length", "d_model"]))
  assert out.shape.to_integer_list == [B, 3, output_size]
  got, params, lowering = _variables(conv, out)
  (name, kernel), = params.items()
  assert kernel.shape == (1, 3, D, output_size), name
  var, = lowering.variables
  assert var.master_dtype == tf.float32
  masked = x * (ids != 0)[..., None]
  padded = np.pad(masked, [(0, 0), (1, 1), (0, 0)])
  expected = sum(np.einsum("bld,do->blo", padded[:, k:k + 3], kernel[0, k])
                 for k in range(3))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("output_size", [D, 2])
def test_separable_conv1d_layer_without_context_variable_dtype(output_size):
  conv = test_utils.NumpyConverter()
  rng = np.random.RandomState(1)
  ids = np.array([[3, 4, 5], [1, 2, 0]])
  x = rng.randn(B, 3, D).astype(np.float32)
  context = BareContext(conv.convert_np_array_to_mtf_tensor(ids, dim_names=["batch",
                                                                            "length"]),
                        tf.float32, "train")
  layer = transformer_layers.SeparableConv1DLayer(min_relative_pos=-1, max_relative_pos=2,
                                                  output_size=output_size)
  out = layer.call(context, _f32(conv, x, ["batch", "length", "d_model"]))
  assert out.shape.to_integer_list == [B, 3, output_size]
  got, params, lowering = _variables(conv, out)
  assert all(v.master_dtype == tf.float32 for v in lowering.variables)
  p = {"/".join(k.split("/")[-2:]): v for k, v in params.items()}
  masked = x * (ids != 0)[..., None]
  padded = np.pad(masked, [(0, 0), (1, 2), (0, 0)])
  depthwise = sum(padded[:, k:k + 3] * p["depthwise_dense_%d/kernel" % k]
                  for k in range(4)) + p["depthwise_dense_0/bias"]
  np.testing.assert_allclose(
      got, depthwise @ p["pointwise_dense/kernel"] + p["pointwise_dense/bias"],
      rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("partial", [False, True])
def test_record_states_first_part_mode(partial):
  conv = test_utils.NumpyConverter()
  rng = np.random.RandomState(2)
  context = _decoder_context(conv, length=6, mode="first_part", initial_position=2,
                             inputs=rng.randint(1, 10, size=[B, 6]))
  x = rng.randn(B, 6, D) if partial else np.zeros((B, 6, D))
  transformer_layers.Conv1D().record_states_first_part_mode(
      context, _f32(conv, x, ["batch", "length", "d_model"]), F)
  expected = np.zeros((B, F, D))
  expected[:, -2], expected[:, -1] = x[:, 0], x[:, 1]
  np.testing.assert_allclose(conv.convert_mtf_tensor_to_np_array(context.new_states[0]),
                             expected, atol=1e-6)


def test_record_states_incremental_mode():
  conv = test_utils.NumpyConverter()
  rng = np.random.RandomState(3)
  state = rng.randn(B, F, D)
  context = _decoder_context(conv, state=state)
  x = rng.randn(B, D)
  transformer_layers.Conv1D().record_states_incremental_mode(
      context, _f32(conv, x, ["batch", "d_model"]), F)
  np.testing.assert_allclose(conv.convert_mtf_tensor_to_np_array(context.new_states[0]),
                             np.concatenate([state[:, 1:], x[:, None]], 1), atol=1e-6)


@pytest.mark.parametrize("position", [F - 1, 1, 0])
def test_update_state_puts_x_at_position(position):
  conv = test_utils.NumpyConverter()
  rng = np.random.RandomState(4)
  x, old = rng.randn(B, D), rng.randn(B, F, D)
  pos = mtf.constant(conv.mesh, position, shape=mtf.Shape([mtf.Dimension("batch", B)]),
                     dtype=tf.int32)
  out = transformer_layers.Conv1D().update_state(
      _f32(conv, old, ["batch", "filter", "d_model"]), _f32(conv, x, ["batch", "d_model"]),
      pos, mtf.Dimension("filter", F), dtype=tf.float32)
  expected = np.concatenate([old[:, 1:], np.zeros((B, 1, D))], 1)
  expected[:, position] += x
  np.testing.assert_allclose(conv.convert_mtf_tensor_to_np_array(out), expected,
                             atol=1e-6)


def test_conv1d_layer_incremental_with_patched_glorot_initializer():
  conv = test_utils.NumpyConverter()
  rng = np.random.RandomState(5)
  state = rng.randn(B, F, D)
  context = _decoder_context(conv, state=state)
  x = rng.randn(B, D)
  conv_filter = rng.randn(1, F, D, 2)

  def factory():
    def init(shape, dtype=None, **unused):
      assert tuple(shape) == conv_filter.shape
      return conv_filter
    return init

  with mock.patch.object(tf.compat.v1, "glorot_uniform_initializer", factory):
    layer = transformer_layers.Conv1DLayer(filter_size=F, output_size=2)
    out = layer.call(context, _f32(conv, x, ["batch", "d_model"]))
  assert out.shape.to_integer_list == [B, 2]
  padded = np.concatenate([state[:, 1:], x[:, None]], 1)
  np.testing.assert_allclose(conv.convert_mtf_tensor_to_np_array(out),
                             np.einsum("bld,hldo->bo", padded, conv_filter),
                             rtol=1e-5, atol=1e-5)


def test_separable_conv1d_layer_incremental_same_name_output():
  conv = test_utils.NumpyConverter()
  rng = np.random.RandomState(6)
  state = rng.randn(B, F, D)
  # Incremental mode does not mask: inputs of a whole sequence are ignored here.
  context = _decoder_context(conv, state=state, inputs=np.zeros([B, 4], np.int32))
  x = rng.randn(B, D)
  taps = [rng.randn(D) for _ in range(F)]
  layer = transformer_layers.SeparableConv1DLayer(min_relative_pos=1 - F,
                                                  max_relative_pos=0, output_size=2)
  out = layer.call(context, _f32(conv, x, ["batch", "d_model"]),
                   all_kernel_wts=[_f32(conv, w, ["d_model"]) for w in taps])
  assert out.shape.to_integer_list == [B, 2]
  got, params, _ = _variables(conv, out)
  p = {"/".join(k.split("/")[-2:]): v for k, v in params.items()}
  assert sorted(p) == ["depthwise_dense_0/bias", "pointwise_dense/bias",
                       "pointwise_dense/kernel"]  # the given taps make no kernels
  padded = np.concatenate([state[:, 1:], x[:, None]], 1)
  depthwise = np.einsum("bld,ld->bd", padded, np.array(taps)) + p["depthwise_dense_0/bias"]
  np.testing.assert_allclose(
      got, depthwise @ p["pointwise_dense/kernel"] + p["pointwise_dense/bias"],
      rtol=1e-5, atol=1e-5)
