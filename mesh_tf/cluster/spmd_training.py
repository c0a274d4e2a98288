"""Training a model in multi-client SPMD mode: this process's replicas step together
with every other process's, the chief (task 0) writes the checkpoints.

The model follows models/train_steps' protocol: `lowering(mesh_impl, *batch)`, `loss`,
`update_ops`. Every replica (the process's one ProcessPlacementMeshImpl, or one
MultiClientMeshImpl per device) lowers the same mtf graph.
"""
import tensorflow as tf

from mesh_tf.checkpoint import save_restore
from mesh_tf.lowering.train_step import lower_train_step


class _FullValue:
  """A gathered full value in the shape of a checkpoint entry's state."""

  def __init__(self, value):
    self.value = value
    self.shape = value.shape
    self.dtype = value.dtype

  def read_value(self):
    return self.value


def _max_over_processes(impl, value):
  """The largest of every processor's scalar `value` (control, not model traffic: not
  recorded in the communication log)."""
  mine = impl.LaidOutTensor([tf.reshape(value, [1])] * len(impl.devices))
  return impl.allreduce(mine, list(range(impl.ndims)), "MAX",
                        record=False).tensor_list[0][0]


class _StepFunction:
  """A replica's step tf.function, whose first argument is the stop value; what
  step_metrics and tests read: get_concrete_function(*batch) is the trace the steps
  run."""

  def __init__(self, function):
    self.function = function

  def get_concrete_function(self, *batch):
    return self.function.get_concrete_function(tf.constant(0.0), *batch)


class SpmdTrainer:
  """Train steps, checkpoints and restores of one model on a ReplicaSet.

  Args:
    model: the model (built once; its mtf graph is shared by the replicas).
    replicas: a mesh_tf.cluster.multi_client.ReplicaSet.
    skip_nonfinite: if True, a step whose loss is NaN/Inf runs no update (every replica
      sees the same loss, so all of them skip it).

  Making the trainer runs collectives (every replica takes processor 0's initial
  values), so every process makes it at the same point of its program.
  """

  def __init__(self, model, replicas, skip_nonfinite=False):
    self.model = model
    self.replicas = replicas
    self.skip_nonfinite = skip_nonfinite
    self._steps = []
    self._agreeing_steps = []
    self._gathers = []
    self._agrees = []
    syncs = []
    for impl in replicas.impls:
      model.lowering(impl)  # creates this replica's variables, eagerly
      self._steps.append(self._make_step(impl))
      self._agreeing_steps.append(self._make_step(impl, agree=True))
      self._gathers.append(self._make_gather(impl))
      self._agrees.append(self._make_agree(impl))
      syncs.append(self._make_sync(impl))
    # every replica drew its own initial values; all take processor 0's
    replicas.run(lambda r, impl: syncs[r]())
    for impl in replicas.impls:
      for v in impl.variable_store.values():
        v.forget_initial_value()

  def _make_step(self, impl, agree=False):
    """The replica's step tf.function (traced at its first call); with agree, it takes
    a stop value first and returns (loss, the processes' largest stop value)."""
    model, skip_nonfinite = self.model, self.skip_nonfinite

    def lowered(*batch):
      return lower_train_step(model.lowering(impl, *batch), model.loss, model.update_ops,
                              skip_nonfinite)
    if not agree:
      return tf.function(lowered)

    @tf.function
    def step(stop, *batch):
      # the stop requests: the first of the step's collectives, so it completes while
      # the step computes (nothing in the step waits on it)
      agreed = _max_over_processes(impl, stop)
      return lowered(*batch), agreed
    return _StepFunction(step)

  @staticmethod
  def _make_agree(impl):
    return tf.function(lambda value: _max_over_processes(impl, value))

  @staticmethod
  def _make_sync(impl):
    @tf.function
    def sync():
      for _, v in sorted(impl.variable_store.items()):
        v.sync_copies()
    return sync

  @staticmethod
  def _make_gather(impl):
    @tf.function
    def gather():
      return {name: v.read_full() for name, v in sorted(impl.variable_store.items())}
    return gather

  def step(self, *batch):
    """One update on every replica; returns the loss before it (as a float).

    `batch` is the full batch or this process's share of it (see input_share).
    """
    losses = self.replicas.run(lambda r, impl: self._steps[r](*batch))
    return float(losses[0])

  def step_and_agree(self, value, *batch):
    """step(*batch), and the largest of every process's `value` (a small int, e.g. a
    stop request) agreed within the same call: (loss, agreed value). Its own trace:
    a loop that calls it every step pays one call, not step's and agree_max's."""
    value = tf.constant(value, tf.float32)
    results = self.replicas.run(
        lambda r, impl: self._agreeing_steps[r].function(value, *batch))
    return float(results[0][0]), int(round(float(results[0][1])))

  def traced_step(self, agreeing=False):
    """Replica 0's step function (of step_and_agree with agreeing), whose
    get_concrete_function(*batch) is the trace the steps run."""
    return (self._agreeing_steps if agreeing else self._steps)[0]

  def agree_max(self, value):
    """The largest of every process's `value` (a small int, e.g. a stop request): a
    collective, so every process calls it at the same point of its loop."""
    value = tf.constant(value, tf.float32)  # a tensor: a new Python value would retrace
    results = self.replicas.run(lambda r, impl: self._agrees[r](value))
    return int(round(float(results[0])))

  def gather(self):
    """{name: full value} of every variable (all processes take part)."""
    return self.replicas.run(lambda r, impl: self._gathers[r]())[0]

  def full_values(self):
    """{name: full value holder} of every variable, in the form a
    mesh_tf.CheckpointManager saves (a plain-variable entry per name)."""
    return {n: _FullValue(v) for n, v in self.gather().items()}

  def save(self, path, global_step=None):
    """Gathers every variable (all processes take part); the chief writes the
    checkpoint. Returns the chief's prefix, None elsewhere."""
    values = self.gather()
    if not self.replicas.is_chief:
      return None
    return save_restore.save_checkpoint(
        path, {n: _FullValue(v) for n, v in values.items()}, global_step=global_step)

  def restore(self, path):
    """Sets every replica's slices from a (full-shape, name-based) checkpoint that all
    processes can read; returns the checkpoint's global step (or None)."""
    result = None
    for impl in self.replicas.impls:
      result = save_restore.restore_checkpoint(path, impl)
    return result.global_step
