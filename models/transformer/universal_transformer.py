"""The Universal Transformer (Dehghani et al. 2018): `UTLayerStack`.

The stack's `layers` form one block, applied num_inrecurrence_layers times per step for
num_rec_steps steps with the same weights. Each step first adds (or concatenates and
projects back with "step_preprocess_projection") a signal of the step: a sinusoid, or
the learned rows of "layer_embedding" (zeros past its rows, as the original's gather).

The original (0.1.21) never adds the sinusoid of the positions, whatever
add_position_timing_signal says; the port matches that by default, and
apply_position_timing_signal=True adds it. The original's "concat" fails whenever a
signal is asked for, so the port's concat-and-project has no original numbers to match.

recurrence_type "basic": x <- block(step_preprocess(x)). "highway": x <- x * carry +
block(...) * transform, each step's gates sigmoid(dense(...)) of gates_inputs (state
"s", transformed state "t", inputs "i"); carry = 1 - transform when
couple_carry_transform_gates. "act": adaptive computation time (Graves 2016): a halting
unit p = sigmoid(w . x + b) (b starts at 1) accumulates per position until it passes
1 - act_epsilon. A step's update weight w is p while a position runs, its remainder R =
1 - (sum of its earlier p) when it halts, then 0. act_type "basic": output <- s * w +
output * (1 - w); "accumulated": output <- s * w + output; "global": "basic" with one p
per sequence, the positions' mean (so no incremental decoding); "random": "basic" with p
uniform in [0, 1). As in the original, steps 0 .. act_max_steps run. The ponder cost
act_loss_weight * mean(N + R) (N: steps taken; a port parameter, default 0) goes to
context.losses.

num_vanilla_transformer_layers ordinary passes through the block may run before and/or
after the recurrence. Each layer is pre-norm residual, x + dropout(y), or with
use_gated_transformer x + dropout(g) for a gate g by gating_type: "highway": x * carry +
y * transform; "gru": z, r = sigmoid(dense([x, y])), c = sigmoid(dense([r * x, y])),
g = (1 - z) * y + z * c. As in the original, gate inputs are layer-normed in place, so a
second gate over the same inputs sees them normed twice. The stack ends with a layer
norm and dropout.

Variables carry the original's names and shapes, so its checkpoints load:
"layer_embedding", "sigmoid_activation_for_pondering/dense/kernel", the gates' unnamed
"dense/kernel", "dense_1/bias", ... (numbered on through the steps), and norms
"layer_prepostprocess/layer_norm/layer_norm_{scale,bias}" shared within a scope.
"""
import math

import gin
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.transformer_layer import TransformerLayer

_RECURRENCE_TYPES = ("basic", "highway", "act")
_ACT_TYPES = ("basic", "accumulated", "global", "random")
_GATING_TYPES = ("highway", "gru")


def _check_choice(what, value, choices):
  if value not in choices:
    raise mtf.MtfError("UTLayerStack: %s=%r is not supported (choose one of %s)" % (
        what, value, ", ".join(repr(c) for c in choices)))


def timing_signal(positions, channels_dim, min_timescale=1.0, max_timescale=1.0e4):
  """Sinusoids of float positions: positions.shape + [channels_dim], sin then cos."""
  half = channels_dim.size // 2
  half_dim = mtf.Dimension(channels_dim.name, half)
  increment = math.log(float(max_timescale) / float(min_timescale)) / max(half - 1, 1)
  inv_timescales = min_timescale * mtf.exp(
      mtf.range(positions.mesh, half_dim, tf.float32) * -increment)
  scaled = positions * inv_timescales
  parts = [mtf.sin(scaled), mtf.cos(scaled)]
  if channels_dim.size % 2:
    parts.append(mtf.zeros(positions.mesh, positions.shape.dims + [
        mtf.Dimension(channels_dim.name, 1)]))
  return mtf.concat(parts, channels_dim.name)


class _ScopeNames:
  """Names for unnamed layers in one entry of a variable scope: "dense", "dense_1", ...,
  as TF1 numbered the original's unnamed dense layers (kernel and bias one number each).
  """

  def __init__(self):
    self._counts = {}

  def __call__(self, default_name):
    count = self._counts.get(default_name, 0)
    self._counts[default_name] = count + 1
    return default_name if not count else "%s_%d" % (default_name, count)


@gin.configurable(module="universal_transformer")
class UTLayerStack(TransformerLayer):
  """A Universal Transformer layer stack (see the module docstring).

  The arguments are the original's, plus act_loss_weight and apply_position_timing_signal.
  position_start_index: an int, or "step" (step * length // steps); "random" only while
  the position signal is not applied. step_timing_signal_type: "learned" or "sinusoid";
  gate_ffn_layer: "dense" or "dense_relu_dense".
  """

  def __init__(self, layers, dropout_rate=0.0, norm_epsilon=1e-6,
               num_vanilla_transformer_layers=2, couple_carry_transform_gates=True,
               act_type=gin.REQUIRED, recurrence_type=gin.REQUIRED,
               act_max_steps=gin.REQUIRED, act_epsilon=gin.REQUIRED,
               num_rec_steps=gin.REQUIRED, num_inrecurrence_layers=gin.REQUIRED,
               position_start_index=gin.REQUIRED, add_or_concat_timing_signal=gin.REQUIRED,
               step_timing_signal_type=gin.REQUIRED,
               add_position_timing_signal=gin.REQUIRED,
               add_step_timing_signal=gin.REQUIRED,
               mix_with_transformer_before_ut=gin.REQUIRED,
               mix_with_transformer_after_ut=gin.REQUIRED, gates_inputs=gin.REQUIRED,
               gate_ffn_layer=gin.REQUIRED, use_gated_transformer=gin.REQUIRED,
               gating_type=gin.REQUIRED, act_loss_weight=0.0,
               apply_position_timing_signal=False):
    _check_choice("recurrence_type", recurrence_type, _RECURRENCE_TYPES)
    _check_choice("act_type", act_type, _ACT_TYPES)
    _check_choice("add_or_concat_timing_signal", add_or_concat_timing_signal,
                  ("add", "concat"))
    _check_choice("step_timing_signal_type", step_timing_signal_type,
                  ("learned", "sinusoid"))
    _check_choice("gate_ffn_layer", gate_ffn_layer, ("dense", "dense_relu_dense"))
    _check_choice("gating_type", gating_type, _GATING_TYPES)
    # "random" is accepted, as by the original, only where no position signal is added.
    if (not isinstance(position_start_index, int) and position_start_index != "step" and
        (apply_position_timing_signal or position_start_index != "random")):
      raise mtf.MtfError("UTLayerStack: position_start_index=%r must be an int or "
                         "'step'" % (position_start_index,))
    if not gates_inputs or set(gates_inputs) - set("sti"):
      raise mtf.MtfError("UTLayerStack: gates_inputs=%r must be letters of 'sti' "
                         "(state, transformed state, inputs)" % (gates_inputs,))
    for name, value in list(locals().items()):  # each argument, as its attribute
      if name not in ("self", "layers"):
        setattr(self, name, value)
    self._layers = list(layers)

  @property
  def layers(self):
    """The layers of the recurrent block."""
    return self._layers

  @property
  def num_layers(self):
    """How many layers the recurrent block holds."""
    return len(self._layers)

  # ------------------------------------------------------------------ helpers
  def _model_dim(self, context, x):
    """The channels dim of x (for timing signals: the width before any concat)."""
    del context
    signal_dim = getattr(self, "_signal_dim", None)
    if signal_dim is not None and signal_dim.name == x.shape.dims[-1].name:
      return signal_dim
    return x.shape.dims[-1]

  def _layer_norm(self, context, x):
    """Layer norm over the last dim ("layer_prepostprocess/layer_norm/...")."""
    del context
    return mtf.layers.layer_norm(x, x.shape.dims[-1], self.norm_epsilon)

  def _dropout(self, context, x):
    if context.train and self.dropout_rate > 0:
      noise_shape = mtf.Shape(list(context.batch_dims) + x.shape.dims[-1:])
      return mtf.dropout(x, rate=self.dropout_rate, noise_shape=noise_shape)
    return x

  def _masked(self, x, mask):
    return x if mask is None else x * mask

  def _num_steps(self):
    return self.act_max_steps if self.recurrence_type == "act" else self.num_rec_steps

  def _shared_weights(self):
    """A scope in which a variable made again is the existing one (AUTO_REUSE)."""
    return mtf.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE)

  def _dense(self, context, x, reduced_dim, new_dim, names, activation=None,
             kernel_initializer=None, bias_initializer=None):
    """activation(x . kernel + bias), kernel and bias in the next two names("dense")."""
    y = mtf.layers.dense(x, new_dim, reduced_dims=[reduced_dim], use_bias=False,
                         kernel_initializer=kernel_initializer,
                         variable_dtype=context.variable_dtype, name=names("dense"))
    with mtf.variable_scope(names("dense")):
      bias = mtf.get_variable(context.mesh, "bias", mtf.Shape([new_dim]),
                              initializer=bias_initializer or tf.zeros_initializer(),
                              dtype=context.variable_dtype)
    y += mtf.cast(bias, y.dtype)
    return y if activation is None else activation(y)

  # ------------------------------------------------------------ timing signals
  def get_timing_signal_1d(self, context, length, channels, min_timescale=1.0,
                           max_timescale=1.0e4, start_index=0):
    """Sinusoids [length, channels] of the positions start_index, start_index + 1, ..."""
    if isinstance(length, int):
      length = mtf.Dimension("length", length)
    if isinstance(channels, int):
      channels = mtf.Dimension("d_model", channels)
    positions = mtf.range(context.mesh, length, tf.float32) + float(start_index)
    return timing_signal(positions, channels, min_timescale, max_timescale)

  def get_layer_timing_signal_learned_1d(self, context, channels, layer, num_layers):
    """Row `layer` of the learned "layer_embedding" [num_layers, channels] * sqrt(channels)."""
    steps_dim = mtf.Dimension("num_ut_steps", num_layers)
    table = mtf.get_variable(
        context.mesh, "layer_embedding", mtf.Shape([steps_dim, channels]),
        initializer=tf.random_normal_initializer(stddev=channels.size ** -0.5),
        dtype=context.variable_dtype)
    if not 0 <= layer < num_layers:  # the original's gather gave zeros out of range
      return mtf.zeros(context.mesh, mtf.Shape([channels]), dtype=table.dtype)
    row = mtf.slice(table, layer, 1, steps_dim.name)
    return mtf.reduce_sum(row, reduced_dim=row.shape.dims[0]) * channels.size ** 0.5

  def _combine_signal(self, x, signal):
    if self.add_or_concat_timing_signal == "add":
      return x + mtf.cast(signal, x.dtype)
    signal = mtf.broadcast(mtf.cast(signal, x.dtype),
                           x.shape.dims[:-1] + signal.shape.dims[-1:])
    return mtf.concat([x, signal], x.shape.dims[-1].name)

  def add_position_timing_signal_func(self, context, x, step):
    """x with the sinusoids of its positions added (or concatenated)."""
    channels = self._model_dim(context, x)
    positions = mtf.cast(context.get_position(), tf.float32)
    start = self.position_start_index
    if start == "step":
      start = step * context.length_dim.size // max(self._num_steps(), 1)
    signal = timing_signal(positions + float(start), channels)
    return self._combine_signal(x, signal)

  def add_step_timing_signal_func(self, context, x, step):
    """x with the signal of the recurrence step added (or concatenated)."""
    channels = self._model_dim(context, x)
    if self.step_timing_signal_type == "learned":
      signal = self.get_layer_timing_signal_learned_1d(context, channels, step,
                                                       self._num_steps())
    else:
      signal = timing_signal(mtf.constant(context.mesh, float(step), []), channels)
    return self._combine_signal(x, signal)

  def step_preprocess(self, context, x, step):
    """The timing signals of a step; a concatenated signal is projected back with the
    dense "step_preprocess_projection" (no bias)."""
    model_dim = x.shape.dims[-1]
    original = x
    self._signal_dim = model_dim  # concatenated signals keep the model width
    if self.add_position_timing_signal and self.apply_position_timing_signal:
      x = self.add_position_timing_signal_func(context, x, step)
    if self.add_step_timing_signal:
      x = self.add_step_timing_signal_func(context, x, step)
    if self.add_or_concat_timing_signal == "concat" and x is not original:
      wide = mtf.Dimension("ut_concat_channels", x.shape.dims[-1].size)
      x = mtf.rename_dimension(x, model_dim.name, wide.name)
      x = mtf.layers.dense(x, model_dim, reduced_dims=[wide], use_bias=False,
                           variable_dtype=context.variable_dtype,
                           name="step_preprocess_projection")
    return x

  # ------------------------------------------------------------------ layers
  def ffn_layer_multi_inputs(self, context, mask, inputs_list, ffn_layer_type="dense",
                             kernel_initializer=None, activation=None, preprocess=False,
                             postprocess=False, names=None):
    """A feed-forward net over several inputs side by side, giving d_model outputs;
    preprocess layer-normalizes each input, postprocess adds dropout. names (a port
    argument, a _ScopeNames) numbers the unnamed layers of the current scope."""
    _check_choice("ffn_layer_type", ffn_layer_type, ("dense", "dense_relu_dense"))
    names = names or _ScopeNames()
    model_dim = inputs_list[0].shape.dims[-1]
    if preprocess:
      # In place, as in the original: a list given again is normalized again.
      inputs_list[:] = [self._layer_norm(context, self._masked(x, mask))
                        for x in inputs_list]
    wide = mtf.Dimension("ffn_input_channels", model_dim.size * len(inputs_list))
    x = mtf.concat([mtf.rename_dimension(t, model_dim.name, wide.name)
                    for t in inputs_list], wide.name)
    if ffn_layer_type == "dense":
      y = self._dense(context, x, wide, model_dim, names, activation=activation,
                      kernel_initializer=kernel_initializer)
    else:
      with mtf.variable_scope(names("dense_relu_dense")):
        hidden = mtf.layers.dense(x, mtf.Dimension("d_ff", model_dim.size),
                                  reduced_dims=[wide], use_bias=True, activation=mtf.relu,
                                  kernel_initializer=kernel_initializer,
                                  variable_dtype=context.variable_dtype, name="wi")
        y = mtf.layers.dense(hidden, model_dim, reduced_dims=hidden.shape.dims[-1:],
                             use_bias=True, activation=activation,
                             variable_dtype=context.variable_dtype, name="wo")
    if postprocess:
      y = self._dropout(context, y)
    return y

  def gating(self, context, x, transformed_x, mask):
    """The gating_type gate between a layer's input x and its output transformed_x (the
    highway gate's carry gate is its own whatever couple_carry_transform_gates)."""
    names = _ScopeNames()

    def gate(inputs, activation=mtf.sigmoid):
      return self.ffn_layer_multi_inputs(
          context, mask, inputs, ffn_layer_type=self.gate_ffn_layer,
          activation=activation, preprocess=True, names=names)

    if self.gating_type == "gru":
      inputs = [x, transformed_x]
      update = gate(inputs)
      reset = gate(inputs)  # of the normalized inputs, normalized again
      candidate = gate([reset * x, transformed_x])
      return (1.0 - update) * transformed_x + update * candidate
    inputs = [x]
    transform = gate(inputs)
    carry = gate(inputs)  # of the normalized x, normalized again
    return x * carry + transformed_x * transform

  def vanilla_transformer_layer(self, context, x, mask):
    """Every layer of the block once: pre-norm, dropout, residual (or the gate)."""
    with self._shared_weights():
      for layer in self._layers:
        with mtf.variable_scope(layer.name or ""):
          norm_x = self._layer_norm(context, self._masked(x, mask))
          with mtf.variable_scope(type(layer).__name__):
            y = layer.call(context, norm_x)
            if y.shape != x.shape:
              raise mtf.ShapeError("UTLayerStack: layer %s returned %s for input %s" % (
                  layer.name, y.shape, x.shape), op=layer.name)
            if self.use_gated_transformer:
              y = self.gating(context, x, y, mask)
          x += self._dropout(context, y)
    return x

  def _block(self, context, x, mask):
    for _ in range(self.num_inrecurrence_layers):
      x = self.vanilla_transformer_layer(context, x, mask)
    return x

  # -------------------------------------------------------------- recurrences
  def ut_basic(self, context, x, mask):
    """num_rec_steps applications of the shared block."""
    with self._shared_weights():
      for step in range(self.num_rec_steps):
        x = self._block(context, self.step_preprocess(context, x, step), mask)
    return x

  def ut_highway(self, context, layer_inputs, mask):
    """Highway recurrence over (state, inputs, memory); returns the final state."""
    with self._shared_weights():
      return self._ut_highway(context, layer_inputs, mask)

  def _ut_highway(self, context, layer_inputs, mask):
    state, inputs, _ = layer_inputs
    names = _ScopeNames()  # the steps' gates are numbered on, so none shares weights

    def gate(gate_inputs):
      return self.ffn_layer_multi_inputs(
          context, mask, gate_inputs, ffn_layer_type=self.gate_ffn_layer,
          activation=mtf.sigmoid, preprocess=True, names=names)

    for step in range(self.num_rec_steps):
      transformed = self._block(context, self.step_preprocess(context, state, step), mask)
      chosen = {"s": state, "t": transformed, "i": inputs}
      gate_inputs = [chosen[c] for c in self.gates_inputs]
      transform = gate(gate_inputs)
      if self.couple_carry_transform_gates:
        carry = 1.0 - transform
      else:
        carry = gate(gate_inputs)
      state = state * carry + transformed * transform
    return state

  def act_layer(self, context, x, mask):
    """Adaptive computation time; returns (output, (ponder_times, remainders))."""
    with self._shared_weights():
      return self._act(context, x, mask)

  def _halting_probability(self, context, state, halting_shape):
    """This step's p: from the halting unit (per position, or pooled per sequence for
    "global"), or uniform noise for "random"."""
    if self.act_type == "random":
      return mtf.random_uniform(context.mesh, halting_shape, dtype=state.dtype)
    model_dim = state.shape.dims[-1]
    one = mtf.Dimension(model_dim.name, 1)
    with mtf.variable_scope("sigmoid_activation_for_pondering"):
      p = self._dense(context, state, model_dim, one, _ScopeNames(),
                      activation=mtf.sigmoid,
                      kernel_initializer=tf.random_normal_initializer(
                          stddev=model_dim.size ** -0.5),
                      bias_initializer=tf.constant_initializer(1.0))
    p = mtf.reduce_sum(p, reduced_dim=p.shape.dims[-1])  # drops the size-1 dim
    if self.act_type == "global":
      p = mtf.reduce_mean(p, output_shape=halting_shape)
    return p

  def _act(self, context, x, mask):
    model_dim = x.shape.dims[-1]
    halting_shape = x.shape - [model_dim]
    if self.act_type == "global":
      if context.mode == "incremental":
        raise mtf.MtfError(
            "UTLayerStack: act_type='global' pools the halting probability over the "
            "whole sequence (dim %r), so it cannot decode incrementally" %
            context.length_dim.name)
      halting_shape -= [context.length_dim]
    threshold = 1.0 - self.act_epsilon
    halting = mtf.zeros(context.mesh, halting_shape, dtype=x.dtype)
    remainders = mtf.zeros(context.mesh, halting_shape, dtype=x.dtype)
    ponder_times = mtf.zeros(context.mesh, halting_shape, dtype=x.dtype)
    state, output = x, mtf.zeros_like(x)
    for step in range(self.act_max_steps + 1):  # one more step, as the original
      state = self.step_preprocess(context, state, step)
      p = self._halting_probability(context, state, halting_shape)
      running = mtf.cast(mtf.less(halting, 1.0), x.dtype)
      reached = halting + p * running
      new_halted = mtf.cast(mtf.greater(reached, threshold), x.dtype) * running
      running = mtf.cast(mtf.less_equal(reached, threshold), x.dtype) * running
      halting += p * running
      remainders += new_halted * (1.0 - halting)
      halting += new_halted * remainders
      ponder_times += running + new_halted
      update = p * running + new_halted * remainders
      state = self._block(context, state, mask)
      if self.act_type == "accumulated":
        output += state * update
      else:
        output = state * update + output * (1.0 - update)
    return output, (ponder_times, remainders)

  def _add_ponder_cost(self, context, ponder_times, remainders):
    """act_loss_weight * mean(N + R) into context.losses."""
    if self.act_loss_weight and context.losses is not None:
      cost = mtf.reduce_mean(ponder_times + remainders, output_shape=[])
      context.losses.append(cost * self.act_loss_weight)

  def call(self, context, x):
    """Dropout, vanilla layers, the recurrence, vanilla layers, final norm, dropout."""
    mask = context.nonpadding
    x = self._dropout(context, x)
    with self._shared_weights():
      if self.mix_with_transformer_before_ut:
        for _ in range(self.num_vanilla_transformer_layers):
          x = self.vanilla_transformer_layer(context, x, mask)
      if self.recurrence_type == "basic":
        x = self.ut_basic(context, x, mask)
      elif self.recurrence_type == "highway":
        x = self.ut_highway(context, (x, x, x), mask)
      else:
        x, (ponder_times, remainders) = self.act_layer(context, x, mask)
        self._add_ponder_cost(context, ponder_times, remainders)
      if self.mix_with_transformer_after_ut:
        for _ in range(self.num_vanilla_transformer_layers):
          x = self.vanilla_transformer_layer(context, x, mask)
      x = self._dropout(context, self._layer_norm(context, x))
    return self._masked(x, mask)
