"""`Context`: the per-call state every Transformer layer reads and writes.

Cached decoding uses two more modes. In "first_part" mode the model runs on the whole
(prompt-holding) sequence and every incremental-aware layer records its per-position
tensors (e.g. keys and values, dim "memory_length") in `new_states`. In "incremental"
mode the model runs on one position, `position` (a scalar int Tensor), with no length
dim; each layer reads its tensors from `states`, writes the new position into them
(`cached_memory`) and records the result.
"""
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import cache_write
from models.transformer import model_layout


class ModeKeys:
  """The original's tf.estimator.ModeKeys values, which TF 2 no longer ships."""
  TRAIN = "train"
  EVAL = "eval"
  PREDICT = "infer"


def is_training(mode):
  """Whether mode means training (accepts the strings and tf.estimator-style keys)."""
  return str(mode).lower() == ModeKeys.TRAIN


class Context:
  """State shared by the layers of one model call (the original's argument names).

  Args:
    mode: ModeKeys.TRAIN / EVAL / PREDICT, or "incremental" / "first_part" in decoding.
    position: int Tensor [batch..., length] of positions (None: 0..length-1).
    position_is_default: whether position is plain 0..length-1 (no packing).
    sequence_id: int Tensor of segment ids of packed examples (0 = padding), or None.
    states, new_states: decoding states read/written by incremental layers.
    losses: list to which layers append auxiliary scalar losses (or None to drop them).
    initial_position: first decoding position in incremental mode.
    layer_outputs: list collecting each layer's output (a fresh one if None).
  """

  def __init__(self, model, mesh, batch_dims, length_dim, variable_dtype, beam_dim=None,
               mode=ModeKeys.TRAIN, position=None, position_is_default=False,
               sequence_id=None, subsequence_id=None, states=None, new_states=None,
               losses=None, initial_position=None, layer_outputs=None,
               encoder_output=None, encoder_sequence_id=None, constant_states=None,
               shared_params=None, encoder_layer_outputs=None, write_priority=None,
               read_priority=None, inputs=None, encoder_inputs=None, num_microbatches=1):
    for name, value in list(locals().items()):  # each argument, as its attribute
      if name != "self":
        setattr(self, name, value)
    self.batch_dims = list(batch_dims)
    if self.layer_outputs is None:
      self.layer_outputs = []
    self.layer_index = 0
    self.next_constant_state = 0
    self.next_states_index = 0
    # Set by a decoding loop that owns `states` (decoding._loop_states): their
    # one-position writes may then go into their buffers (cache_write.py).
    self.write_states_in_place = False

  @property
  def mesh_layout(self):
    """The model's MeshLayout (or one of its layout and mesh_shape), or None."""
    mesh_layout = getattr(self.model, "mesh_layout", None)
    if mesh_layout is None:
      mesh_layout = model_layout.mesh_layout_of(getattr(self.model, "layout", None),
                                                getattr(self.model, "mesh_shape", None))
    return mesh_layout

  @property
  def incremental(self):
    """Whether this call decodes one position from cached states."""
    return self.mode == "incremental"

  @property
  def train(self):
    """Whether this call trains (dropout on, z-loss on)."""
    return is_training(self.mode)

  @property
  def activation_dtype(self):
    """The dtype of activations (the variables' activation dtype)."""
    return self.variable_dtype.activation_dtype

  @property
  def encoder_length_dim(self):
    """The length dim of the encoder output (None without an encoder)."""
    if self.encoder_output is None:
      return None
    return self.encoder_output.shape.dims[-2]

  @property
  def nonpadding(self):
    """Float Tensor, 1.0 where sequence_id marks a real token; None if unpacked."""
    if self.sequence_id is None or isinstance(self.sequence_id, int):
      return None
    return mtf.cast(mtf.not_equal(self.sequence_id, 0), self.activation_dtype)

  def get_position(self):
    """context.position (in incremental mode the scalar position), else 0..length-1."""
    if self.position is not None:
      return self.position
    return mtf.range(self.mesh, self.length_dim, tf.int32)

  def get_states(self, n):
    """The next n decoding states (in the order layers recorded them)."""
    states = self.states[self.next_states_index:self.next_states_index + n]
    self.next_states_index += n
    return states

  def record_new_states(self, new_states):
    """Appends this layer's new decoding states."""
    self.new_states.extend(new_states)

  def record_constant_state(self, s):
    """Records a state computed once in "first_part" mode and reused afterwards."""
    self.constant_states.append(s)

  def get_constant_state(self):
    """The next constant state recorded in "first_part" mode."""
    ret = self.constant_states[self.next_constant_state]
    self.next_constant_state += 1
    return ret


def incremental_aware(call):
  """Marks a layer's call method as handling the "first_part" and "incremental" modes
  (decoding uses the cached path only when every layer's call is so marked)."""
  call.incremental_aware = True
  return call


def cached_memory(context, tensors):
  """Per-position tensors (keys, values, ...) through the decoding caches: the tensors
  (with dim "memory_length"; in "first_part" mode recorded as the caches), or in
  "incremental" mode (tensors without a length dim) the caches with them written at
  context.position."""
  tensors = list(tensors)
  if context.mode == "first_part":
    context.record_new_states(tensors)
    return tensors
  if context.mode != "incremental":
    return tensors
  if context.states is None or context.next_states_index + len(tensors) > len(
      context.states):
    raise mtf.MtfError("incremental decoding: a layer asked for %d cached states beyond "
                       "the %d recorded in first_part mode" % (
                           len(tensors), len(context.states or [])))
  updated = []
  for old, new in zip(context.get_states(len(tensors)), tensors):
    if not old.shape.has_dim("memory_length"):
      raise mtf.ShapeError("incremental decoding: cached state %s %s has no "
                           "memory_length dim" % (old.name, old.shape), tensor=old.name)
    if context.position.shape.ndims:  # per-row positions: a one-hot blend
      memory_length = old.shape.get_dim_by_name("memory_length")
      at = mtf.one_hot(context.position, memory_length, dtype=old.dtype)
      # Multiplying by exact 0/1 keeps the other positions bit for bit.
      updated.append(mtf.add(old * (1 - at), mtf.cast(new, old.dtype) * at,
                             output_shape=old.shape))
    else:  # one position for every row: written in place, O(size of new) per step
      updated.append(cache_write.write_at_position(
          old, new, context.position,
          in_place=context.write_states_in_place))
  context.record_new_states(updated)
  return updated
