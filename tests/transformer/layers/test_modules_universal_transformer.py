"""UTLayerStack: the basic, highway and ACT recurrences (ACT types basic, accumulated,
global, random; the ponder cost; timing signals added or concatenated, learned or
sinusoid step signals, highway- and GRU-gated layers, vanilla layers around the
recurrence), forward and every gradient against plain TF from the same weights, on one
device and on a dp+mp layout on placement and SIMD emulation; weight sharing across
steps; bad options; the original's quirks (no position signal, one more ACT step,
the gated residual, the GRU's sigmoid candidate, gate inputs normalized again)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from test_transformer_layers import (  # pylint: disable=g-multiple-import
    D_MODEL, LENGTH, _x, check_against_reference, run_layer)
from models.transformer import transformer_layers as tl
from models.transformer.universal_transformer import UTLayerStack

D_FF = 8
CASES = [("placement", "", ""),
         ("placement", "rows:2;cols:4", "batch:rows;d_ff:cols"),
         ("simd", "rows:2;cols:4", "batch:rows;d_ff:cols")]
CASE_IDS = ["single", "placement_dp_mp", "simd_dp_mp"]

BASE = dict(act_type="basic", act_max_steps=3, act_epsilon=0.01, num_rec_steps=2,
            num_inrecurrence_layers=1, position_start_index=0,
            add_or_concat_timing_signal="add", step_timing_signal_type="learned",
            add_position_timing_signal=True, add_step_timing_signal=True,
            mix_with_transformer_before_ut=False, mix_with_transformer_after_ut=False,
            gates_inputs="sti", gate_ffn_layer="dense", use_gated_transformer=False,
            gating_type="highway", num_vanilla_transformer_layers=1)


def _stack(**overrides):
  layer = tl.DenseReluDense(hidden_size=D_FF)
  layer.set_name("layer_000")
  options = dict(BASE)
  options.update(overrides)
  return UTLayerStack([layer], **options)


# ------------------------------------------------------------------ TF reference
def tf_timing(positions, channels):
  half = channels // 2
  inv = np.exp(np.arange(half) * -np.log(1e4) / max(half - 1, 1))
  scaled = np.asarray(positions, np.float64)[..., None] * inv
  return tf.constant(np.concatenate([np.sin(scaled), np.cos(scaled)], -1), tf.float32)


def layer_norm(x, v, scope):
  """The layer norm "<scope>/layer_prepostprocess/layer_norm/..." of weights v."""
  p = _key(scope, "layer_prepostprocess_layer_norm_layer_norm_")
  mean = tf.reduce_mean(x, -1, keepdims=True)
  variance = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
  return (x - mean) * tf.math.rsqrt(variance + 1e-6) * v[p + "scale"] + v[p + "bias"]


def _key(scope, name):
  return scope + "_" + name if scope else name


class Reference:
  """The UTLayerStack computation in TF from weights v (scope-flattened names)."""

  def __init__(self, options, v):
    self.o, self.v = options, v

  def vanilla(self, x):
    p = "layer_000"
    y = tf.nn.relu(layer_norm(x, self.v, p) @ self.v[p + "_DenseReluDense_wi_kernel"]) @ (
        self.v[p + "_DenseReluDense_wo_kernel"])
    if not self.o["use_gated_transformer"]:
      return x + y
    gate = self.gates(p + "_DenseReluDense")
    if self.o["gating_type"] == "gru":
      inputs = [x, y]
      update = gate(inputs)
      reset = gate(inputs)  # the inputs normalized twice
      candidate = gate([reset * x, y])
      return x + (1 - update) * y + update * candidate
    inputs = [x]
    transform = gate(inputs)
    carry = gate(inputs)  # never coupled; x normalized twice
    return x + x * carry + y * transform

  def gates(self, scope):
    """A function making the gates of scope in turn: unnamed dense layers whose kernel
    and bias take the scope's next two numbers, over inputs normed with one norm (in
    place: a list passed again is normed again, as in the original)."""
    count = [0]

    def gate(inputs, activation=tf.sigmoid):
      inputs[:] = [layer_norm(t, self.v, scope) for t in inputs]
      normed = tf.concat(inputs, -1)
      names = ["dense_%d" % i if i else "dense" for i in (count[0], count[0] + 1)]
      count[0] += 2
      y = (normed @ self.v[_key(scope, names[0] + "_kernel")] +
           self.v[_key(scope, names[1] + "_bias")])
      return activation(y)
    return gate

  def preprocess(self, x, step):
    signals = []
    if (self.o["add_position_timing_signal"] and
        self.o.get("apply_position_timing_signal")):
      start = self.o["position_start_index"]
      if start == "step":
        steps = (self.o["act_max_steps"] if self.o["recurrence_type"] == "act"
                 else self.o["num_rec_steps"])
        start = step * LENGTH // steps
      signals.append(tf_timing(np.arange(LENGTH) + start, D_MODEL))
    if self.o["add_step_timing_signal"]:
      if self.o["step_timing_signal_type"] == "learned":
        table = self.v["layer_embedding"]  # a step past its rows: zeros
        row = table[step] if step < table.shape[0] else tf.zeros_like(table[0])
        signals.append(row * D_MODEL ** 0.5)
      else:
        signals.append(tf_timing(float(step), D_MODEL))
    if self.o["add_or_concat_timing_signal"] == "add" or not signals:
      return x + sum(signals)
    wide = tf.concat([x] + [tf.broadcast_to(s, x.shape) for s in signals], -1)
    return wide @ self.v["step_preprocess_projection_kernel"]

  def block(self, x):
    for _ in range(self.o["num_inrecurrence_layers"]):
      x = self.vanilla(x)
    return x

  def __call__(self, x):
    o = self.o
    if o["mix_with_transformer_before_ut"]:
      for _ in range(o["num_vanilla_transformer_layers"]):
        x = self.vanilla(x)
    if o["recurrence_type"] == "basic":
      for step in range(o["num_rec_steps"]):
        x = self.block(self.preprocess(x, step))
    elif o["recurrence_type"] == "highway":
      state, inputs = x, x
      gate = self.gates("")  # numbered on through the steps: each step its own gates
      for step in range(o["num_rec_steps"]):
        transformed = self.block(self.preprocess(state, step))
        chosen = {"s": state, "t": transformed, "i": inputs}
        gate_in = [chosen[c] for c in o["gates_inputs"]]
        transform = gate(gate_in)
        carry = 1 - transform if o["couple_carry_transform_gates"] else gate(gate_in)
        state = state * carry + transformed * transform
      x = state
    else:
      x = self.act(x)
    if o["mix_with_transformer_after_ut"]:
      for _ in range(o["num_vanilla_transformer_layers"]):
        x = self.vanilla(x)
    return layer_norm(x, self.v, "")

  def act(self, x):
    kernel = self.v["sigmoid_activation_for_pondering_dense_kernel"]
    bias = self.v["sigmoid_activation_for_pondering_dense_1_bias"]
    threshold = 1.0 - self.o["act_epsilon"]
    pooled = self.o["act_type"] == "global"
    halting = tf.zeros(x.shape[:1] if pooled else x.shape[:-1])
    remainders = tf.zeros_like(halting)
    ponder = tf.zeros_like(halting)
    state, output = x, tf.zeros_like(x)
    for step in range(self.o["act_max_steps"] + 1):
      state = self.preprocess(state, step)
      p = tf.sigmoid(state @ kernel + bias)[..., 0]
      if pooled:
        p = tf.reduce_mean(p, 1)
      running = tf.cast(halting < 1.0, tf.float32)
      reached = halting + p * running
      new_halted = tf.cast(reached > threshold, tf.float32) * running
      running = tf.cast(reached <= threshold, tf.float32) * running
      halting += p * running
      remainders += new_halted * (1.0 - halting)
      halting += new_halted * remainders
      ponder += running + new_halted
      update = p * running + new_halted * remainders
      update = update[:, None, None] if pooled else update[..., None]
      state = self.block(state)
      if self.o["act_type"] == "accumulated":
        output += state * update
      else:
        output = state * update + output * (1 - update)
    self.ponder_cost = tf.reduce_mean(ponder + remainders)
    return output


CONFIGS = {
    "basic_learned_steps_with_vanilla_before": dict(
        recurrence_type="basic", mix_with_transformer_before_ut=True),
    "highway_concat_sinusoid_gated": dict(
        recurrence_type="highway", add_or_concat_timing_signal="concat",
        step_timing_signal_type="sinusoid", couple_carry_transform_gates=False,
        use_gated_transformer=True, position_start_index=3,
        mix_with_transformer_after_ut=True, apply_position_timing_signal=True),
    "act_step_positions": dict(recurrence_type="act", position_start_index="step",
                               apply_position_timing_signal=True),
    "act_no_position_signal": dict(recurrence_type="act"),
    "act_accumulated": dict(recurrence_type="act", act_type="accumulated",
                            act_max_steps=4),
    "act_global_gru_gated": dict(
        recurrence_type="act", act_type="global", use_gated_transformer=True,
        gating_type="gru", mix_with_transformer_after_ut=True),
    "basic_two_passes_per_step_with_vanilla_after": dict(
        recurrence_type="basic", num_inrecurrence_layers=2,
        mix_with_transformer_after_ut=True, num_vanilla_transformer_layers=2),
    "basic_gru_gated_uncoupled": dict(
        recurrence_type="basic", use_gated_transformer=True, gating_type="gru",
        mix_with_transformer_before_ut=True, couple_carry_transform_gates=False),
}


def _one_device_and_one_mesh(names):
  """(name, case) pairs: every name on one device and on one of the two meshes, the
  meshes taken in turn, so each backend's mesh sees half the names (the suite's time
  goes to more configurations rather than to every configuration on every mesh)."""
  pairs = []
  for i, name in enumerate(names):
    pairs.append(pytest.param(name, CASES[0], id="%s-%s" % (name, CASE_IDS[0])))
    mesh = 1 + i % 2
    pairs.append(pytest.param(name, CASES[mesh], id="%s-%s" % (name, CASE_IDS[mesh])))
  return pairs


@pytest.mark.parametrize("config,case", _one_device_and_one_mesh(sorted(CONFIGS)))
def test_ut_layer_stack_matches_tf(config, case):
  options = dict(BASE, couple_carry_transform_gates=True)
  options.update(CONFIGS[config])
  stack = _stack(**CONFIGS[config])
  x = _x(7)
  result, w = run_layer(stack, mtf_testing.backend_mesh_impl(*case), x)
  check_against_reference(result, w, x, lambda x, **v: Reference(options, v)(x),
                          rtol=1e-4, atol=1e-4)
  # One set of block weights serves every step and every vanilla pass, as in the
  # original: the FFN's kernel exists once, in the layer's own scope.
  wi = [n for n in result.values if n.endswith("/wi/kernel")]
  assert wi == ["transformer/block_000/layer_000/layer_000/DenseReluDense/wi/kernel"], wi


def test_act_halts_every_position_within_the_steps():
  context, x = _eval_context(seed=8)
  mesh, graph = x.mesh, x.graph
  _, (ponder, remainders) = _stack(recurrence_type="act", act_max_steps=4).act_layer(
      context, x, None)
  tf.random.set_seed(8)  # the same initial weights whatever ran before
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl(*CASES[0])})
  ponder = lowering.export_to_tf_tensor(ponder).numpy()
  remainders = lowering.export_to_tf_tensor(remainders).numpy()
  # A position that halts at step n has ponder time n and a remainder in (0, 1], 1 only
  # when it halts at once (n = 1); one still running after the last of the
  # act_max_steps + 1 steps has ponder time 5 and no remainder.
  assert ponder.min() >= 1 and ponder.max() <= 5, ponder
  assert np.all((remainders >= 0) & (remainders <= 1)), remainders
  assert np.all(ponder[remainders == 1] == 1), (ponder, remainders)
  halted = remainders > 0
  assert halted.any() and np.all(ponder[~halted] == 5), (ponder, remainders)


@pytest.mark.parametrize("option,value,message", [
    ("recurrence_type", "lstm", "recurrence_type='lstm'"),
    ("act_type", "lstm", "act_type='lstm'"),
    ("gating_type", "lstm", "gating_type='lstm'"),
    ("gates_inputs", "sx", "gates_inputs='sx'"),
    ("position_start_index", "random", "position_start_index='random'")])
def test_unsupported_options_are_named(option, value, message):
  with pytest.raises(mtf.MtfError, match=message):
    _stack(**{"recurrence_type": "basic", option: value,
              "apply_position_timing_signal": True})


def test_random_position_start_is_accepted_while_no_position_signal_is_added():
  """The original accepts it: its position signal is never added."""
  _stack(recurrence_type="basic", position_start_index="random")


@pytest.mark.parametrize("recurrence", ["basic", "highway", "act"])
def test_cached_decoding_matches_the_full_sequence(recurrence):
  """Greedy incremental decoding of a UT language model picks, at every step, the
  argmax of the full-sequence pass over the decoded text."""
  from models.transformer import transformer  # pylint: disable=g-import-not-at-top
  attention = tl.SelfAttention(num_heads=2, key_value_size=4)
  attention.set_name("layer_000")
  ffn = tl.DenseReluDense(hidden_size=8)
  ffn.set_name("layer_001")
  options = dict(BASE, recurrence_type=recurrence, mix_with_transformer_before_ut=True)
  if recurrence == "highway":
    options["add_or_concat_timing_signal"] = "concat"
  model = transformer.Unitransformer(
      layer_stack=UTLayerStack([attention, ffn], **options), d_model=D_MODEL,
      input_vocab_size=16, output_vocab_size=16, autoregressive=True, max_length=LENGTH,
      vocab_divisor=8)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  prompt = np.zeros((2, LENGTH), np.int32)
  prompt[:, 0] = [3, 5]
  dims = [mtf.Dimension("batch", 2), mtf.Dimension("length", LENGTH)]
  decoded = model.sample_autoregressive(mtf.import_tf_tensor(mesh, prompt, dims),
                                        temperature=0.0)
  logits, _ = model.call_simple(transformer.autoregressive_inputs(decoded), decoded,
                                compute_loss=False, mode="eval")
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl(*CASES[0])})
  decoded = lowering.export_to_tf_tensor(decoded).numpy()
  logits = lowering.export_to_tf_tensor(logits).numpy()
  for row, picks in zip(decoded, logits.argmax(-1)):
    end = list(row).index(1) + 1 if 1 in row[1:] else LENGTH  # decoding stops at EOS
    np.testing.assert_array_equal(picks[1:end], row[1:end])


class _OutputPlusLosses(tl.TransformerLayer):
  """The stack's output plus the auxiliary losses it added, so the gradient check
  covers the ponder cost too."""

  def __init__(self, stack):
    self.stack = stack

  def call(self, context, x):
    y = self.stack.call(context, x)
    for loss in context.losses:
      y += loss
    return y


@pytest.mark.parametrize("act_type,case", _one_device_and_one_mesh(["basic", "global"]))
def test_ponder_cost_and_its_gradients_match_tf(act_type, case):
  options = dict(BASE, recurrence_type="act", act_type=act_type, act_max_steps=4,
                 couple_carry_transform_gates=True)
  stack = _stack(recurrence_type="act", act_type=act_type, act_max_steps=4,
                 act_loss_weight=0.5)
  x = _x(3)
  result, w = run_layer(_OutputPlusLosses(stack), mtf_testing.backend_mesh_impl(*case), x)

  def reference(x, **v):
    ref = Reference(options, v)
    y = ref(x)
    return y + 0.5 * ref.ponder_cost

  check_against_reference(result, w, x, reference, rtol=1e-4, atol=1e-4)
  assert len(result.losses) == 1 and result.losses[0] > 0.5, result.losses


def _act_outputs(act_type, steps, seed=8):
  from models.transformer.context import Context  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", LENGTH)
  x = mtf.import_tf_tensor(mesh, _x(seed), [batch, length,
                                            mtf.Dimension("d_model", D_MODEL)])
  losses = []
  context = Context(None, mesh, [batch], length, mtf.VariableDType(tf.float32),
                    mode="eval", losses=losses)
  stack = _stack(recurrence_type="act", act_type=act_type, act_max_steps=steps,
                 act_loss_weight=2.0)
  y, (ponder, remainders) = stack.act_layer(context, x, None)
  stack._add_ponder_cost(context, ponder, remainders)  # pylint: disable=protected-access
  names = [v.name for v in graph.trainable_variables]
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl(*CASES[0])})
  export = lambda t: lowering.export_to_tf_tensor(t).numpy()
  return export(y), export(ponder), export(remainders), export(losses[0]), names


def test_random_act_halts_on_noise_without_a_halting_unit():
  steps = 6
  y, ponder, remainders, cost, names = _act_outputs("random", steps)
  assert not [n for n in names if "pondering" in n], names
  # Noise in [0, 1) halts every position within the steps; no remainder reaches 1.
  assert ponder.min() >= 1 and ponder.max() <= steps + 1, ponder
  assert np.all((remainders >= 0) & (remainders < 1)), remainders
  assert np.all(np.isfinite(y)) and np.abs(y).max() > 0
  np.testing.assert_allclose(cost, 2.0 * np.mean(ponder + remainders), rtol=1e-5)


def test_global_act_halts_each_sequence_as_a_whole():
  _, ponder, remainders, _, names = _act_outputs("global", 4)
  assert ponder.shape == (2,) and remainders.shape == (2,), (ponder, remainders)
  assert any("sigmoid_activation_for_pondering" in n for n in names), names


def test_global_act_refuses_incremental_decoding():
  from models.transformer.context import Context  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 1)
  x = mtf.zeros(mesh, [batch, length, mtf.Dimension("d_model", D_MODEL)])
  context = Context(None, mesh, [batch], length, mtf.VariableDType(tf.float32),
                    mode="incremental")
  with pytest.raises(mtf.MtfError, match="act_type='global'.*incrementally"):
    _stack(recurrence_type="act", act_type="global").act_layer(context, x, None)


# ------------------------------------------------- the original's computations
def _eval_context(length=LENGTH, seed=5):
  """An eval-mode Context on a fresh one-processor mesh, and an input x of _x(seed)."""
  from models.transformer.context import Context  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", length)
  x = mtf.import_tf_tensor(mesh, _x(seed),
                           [batch, length, mtf.Dimension("d_model", D_MODEL)])
  context = Context(None, mesh, [batch], length, mtf.VariableDType(tf.float32),
                    mode="eval")
  return context, x


def _evaluate(context, *tensors):
  tf.random.set_seed(5)  # the same initial weights for graphs of the same variables
  lowering = mtf.Lowering(context.mesh.graph,
                          {context.mesh: mtf_testing.backend_mesh_impl(*CASES[0])})
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors]


def _stack_output(**overrides):
  context, x = _eval_context()
  return _evaluate(context, _stack(**overrides).call(context, x))[0]


@pytest.mark.parametrize("recurrence", ["basic", "act"])
def test_position_timing_signal_is_not_added_by_default(recurrence):
  """As in the original, add_position_timing_signal=True changes nothing; the port's
  apply_position_timing_signal=True adds it."""
  options = dict(recurrence_type=recurrence, position_start_index=2)
  without = _stack_output(add_position_timing_signal=False, **options)
  asked = _stack_output(add_position_timing_signal=True, **options)
  applied = _stack_output(add_position_timing_signal=True,
                          apply_position_timing_signal=True, **options)
  np.testing.assert_array_equal(asked, without)
  assert np.abs(applied - without).max() > 1e-3


def test_act_runs_one_step_more_than_act_max_steps():
  """Steps 0 .. act_max_steps, the last with a zero learned step signal."""
  steps = []

  class Recording(UTLayerStack):

    def step_preprocess(self, context, x, step):
      steps.append(step)
      return super().step_preprocess(context, x, step)

  layer = tl.DenseReluDense(hidden_size=D_FF)
  layer.set_name("layer_000")
  stack = Recording([layer], **dict(BASE, recurrence_type="act", act_max_steps=3))
  context, x = _eval_context()
  _, (ponder, _) = stack.act_layer(context, x, None)
  channels = x.shape.dims[-1]
  with mtf.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE):  # the stack's table
    last = stack.get_layer_timing_signal_learned_1d(context, channels, 3, 3)
    first = stack.get_layer_timing_signal_learned_1d(context, channels, 0, 3)
  ponder, last, first = _evaluate(context, ponder, last, first)
  assert steps == [0, 1, 2, 3], steps
  assert ponder.max() <= 4
  np.testing.assert_array_equal(last, np.zeros(D_MODEL))
  assert np.abs(first).max() > 0


def test_gated_layer_keeps_the_residual():
  """A gated layer adds the gate's output to its input: a zero gate leaves x as it is."""

  class ZeroGate(UTLayerStack):

    def gating(self, context, x, transformed_x, mask):
      return transformed_x * 0.0

  layer = tl.DenseReluDense(hidden_size=D_FF)
  layer.set_name("layer_000")
  stack = ZeroGate([layer], **dict(BASE, recurrence_type="basic",
                                   use_gated_transformer=True))
  context, x = _eval_context()
  y = stack.vanilla_transformer_layer(context, x, None)
  y, x = _evaluate(context, y, x)
  np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-6)


def test_gru_gate_candidate_is_a_sigmoid():
  """The GRU gating's update, reset and candidate layers all end in a sigmoid."""
  activations = []

  class Recording(UTLayerStack):

    def ffn_layer_multi_inputs(self, *args, **kwargs):
      activations.append(kwargs.get("activation"))
      return super().ffn_layer_multi_inputs(*args, **kwargs)

  layer = tl.DenseReluDense(hidden_size=D_FF)
  layer.set_name("layer_000")
  stack = Recording([layer], **dict(BASE, recurrence_type="basic",
                                    use_gated_transformer=True, gating_type="gru"))
  context, x = _eval_context()
  stack.vanilla_transformer_layer(context, x, None)
  assert activations == [mtf.sigmoid] * 3, activations


def test_gate_inputs_given_again_are_normalized_again():
  """As in the original, ffn_layer_multi_inputs normalizes its list in place, so a
  second gate over the same list sees the inputs normalized twice."""
  stack = _stack(recurrence_type="highway")
  context, x = _eval_context()
  inputs = [x]
  with mtf.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE):  # one scope, one norm
    stack.ffn_layer_multi_inputs(context, None, inputs, preprocess=True)
    once = inputs[0]
    stack.ffn_layer_multi_inputs(context, None, inputs, preprocess=True)
    twice = inputs[0]
  assert once is not x and twice is not once
  # (With the initial scale 1 and bias 0, a second norm changes almost nothing.)
  x, once = _evaluate(context, x, once)
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  np.testing.assert_allclose(once, (x - mean) / np.sqrt(var + 1e-6), rtol=1e-4, atol=1e-5)
