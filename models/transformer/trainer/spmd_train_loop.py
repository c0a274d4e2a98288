"""Train mode in multi-client SPMD (cluster_setup.cluster_config.mode = 'spmd'): every
process runs step_loop.run_steps for its own replicas (one per local device), reads only
its rows of each batch, and task 0 writes the checkpoints and summaries.

Each process checks its run against the chief's before step 1, and a signal to ANY
process stops EVERY process after the same step. Everything else is train_loop's;
microbatches are not supported.
"""
import os

import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.cluster import input_share
from mesh_tf.checkpoint import discovery
from mesh_tf.checkpoint import manager as checkpoint_manager
from mesh_tf.checkpoint.entries import collect_entries
from mesh_tf.checkpoint.save_restore import DEFAULT_BASENAME
from mesh_tf.cluster import agreement
from mesh_tf.cluster import spmd_training
from models.transformer import model_graph
from models.transformer.trainer import run_checkpoints
from models.transformer.trainer import run_record
from models.transformer.trainer import run_setup
from models.transformer.trainer import spmd_evaluation
from models.transformer.trainer import step_loop
from models.transformer.trainer import step_metrics
from models.transformer.trainer import stop_signals
from models.transformer.trainer import train_loop
from models.transformer.context import ModeKeys


def share_of_train_data(examples, batch_size, rows, step=0):
  """This process's rows [begin, end) of every global batch of the train data (the
  run_setup.example_stream `examples`) after the `step` ones already trained on; the
  other processes' examples are dropped before batching."""
  if step:
    print(run_setup.resume_skip_line(step, batch_size), flush=True)
  return input_share.share_of_dataset(examples, batch_size, rows, skip_batches=step)


# Bindings that may differ between processes of one run (gin may write a shorter
# selector: "run.model_dir"), as (configurable, parameter).
PER_TASK_BINDINGS = (("run", "model_dir"),)


def gin_bindings(config_text):
  """{binding: value text} of gin's config text (a value may span lines)."""
  bindings, name = {}, None
  for line in config_text.splitlines():
    if not line.strip() or line.lstrip().startswith("#"):
      continue
    if not line[0].isspace() and " = " in line:
      name, _, value = line.partition(" = ")
      bindings[name.strip()] = value.strip()
    elif name is not None:
      bindings[name] += " " + line.strip()
  return bindings


def run_settings(model_dir, vocabulary, replicas):
  """{setting: value text} every process of an SPMD run must share with the chief:
  the gin config less per-task bindings, the checkpoint it resumes from, the
  vocabulary, the mesh and the layout."""
  settings = {"gin " + k: v for k, v in gin_bindings(gin.config_str()).items()
              if tuple(k.split(".")[-2:]) not in PER_TASK_BINDINGS}
  found = discovery.find_checkpoints(model_dir, DEFAULT_BASENAME)
  settings["checkpoint to resume from"] = (
      os.path.basename(found.checkpoints[-1]) if found.checkpoints else "none")
  for key, value in run_record.vocabulary_record(vocabulary).items():
    settings["vocabulary " + key] = str(value)
  settings["mesh"] = replicas.mesh_shape.to_string
  settings["layout"] = str(replicas.impls[0].layout_rules)
  return settings


def run_spmd_train(config, replicas):
  """Trains a run_config.RunConfig to its train_steps with this process's replicas
  (evaluating after every checkpoint, as run_train); returns [(step, loss)]."""
  c = config
  model_fn, model_dir, vocabulary = c.model_fn, c.model_dir, c.vocabulary
  batch_size, sequence_length = c.batch_size, c.sequence_length
  train_steps, variable_dtype = c.train_steps, c.variable_dtype
  # built first, as run_train builds its data, so shuffles get the same op seeds
  examples = run_setup.example_stream(c.train_dataset_fn, sequence_length, vocabulary,
                                      c.dataset_split)
  # before any collective of the model: a peer with another mesh or shapes would fail
  # those deep inside TF
  agreement.agree_with_chief(replicas, run_settings(model_dir, vocabulary, replicas),
                             replicas.startup_timeout)
  global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
  mtf.optimize.set_global_step(global_step)
  rate = train_loop.make_learning_rate(c.learning_rate_schedule, global_step,
                                       c.total_run_steps or train_steps)
  optimizer = train_loop.make_optimizer(c.optimizer, rate)
  graph = model_graph.ModelGraph(
      model_fn(), batch_size, sequence_length, run_setup.feature_keys(examples),
      ModeKeys.TRAIN, variable_dtype, optimizer=optimizer)
  trainer = spmd_training.SpmdTrainer(graph, replicas,
                                      skip_nonfinite=c.skip_nonfinite_updates)
  rows = input_share.batch_rows(replicas.impls[0], graph.placeholders["targets"].shape)
  saver = ChiefSaver(trainer, model_dir, global_step, c.keep_checkpoint_max)
  runner = _SpmdRunner(trainer, saver, graph, optimizer)
  if c.eval_dataset_fn is not None and c.eval_steps:
    eval_probe = run_setup.batched_dataset(c.eval_dataset_fn, sequence_length, vocabulary,
                                           "validation", batch_size)
    evaluator = spmd_evaluation.SpmdEvaluator(
        model_fn, replicas, batch_size, sequence_length,
        run_setup.feature_keys(eval_probe), variable_dtype)
    runner.eval_plan = step_loop.EvalPlan(
        evaluator, evaluator.dataset(c.eval_dataset_fn, sequence_length, vocabulary,
                                     batch_size), c.eval_steps)
  with stop_signals.GracefulStop() as stop:  # from here a signal waits for a step's end
    step = saver.restore()
    print("training %s on mesh %s, layout %s (%s: task %d of %d, %s, rows [%d, %d) of "
          "each batch), to step %d"
          % (type(graph.model).__name__, replicas.mesh_shape.to_string,
             replicas.impls[0].layout_rules, type(replicas.impls[0]).__name__,
             replicas.task, len(replicas.addresses), replicas.program_summary, rows[0], rows[1],
             train_steps), flush=True)
    if step_loop.nothing_to_do(step, train_steps):
      return []
    iterator = iter(share_of_train_data(examples, batch_size, rows, step))
    return step_loop.run_steps(runner, c.loop, step, iterator, stop)


class ChiefSaver:
  """Checkpoints of an SPMD run: every process gathers, the chief writes through a
  mtf.CheckpointManager (which keeps keep_checkpoint_max of them and refuses NaN/Inf)."""

  def __init__(self, trainer, model_dir, global_step, keep_checkpoint_max):
    self.trainer = trainer
    self.model_dir = model_dir
    self.global_step = global_step
    self._values = {}  # refilled before each save with the gathered full values
    self.manager = (run_checkpoints.open_manager(model_dir, self._values, global_step,
                                                 keep_checkpoint_max)
                    if trainer.replicas.is_chief else None)
    # Every process resolves the checkpoint by the one rule train/eval/decode use, so a
    # lost or garbled state file cannot make processes resume from different steps.
    found = discovery.find_checkpoints(model_dir, DEFAULT_BASENAME)
    self.latest = found.checkpoints[-1] if found.checkpoints else None
    self.saved_step = None

  def restore(self):
    """Resumes every replica from model_dir's latest checkpoint; returns the step."""
    if not self.latest:
      return 0
    run_record.check_checkpoint(self.latest)  # every process, so all stop alike
    step = int(self.trainer.restore(self.latest) or 0)
    self.global_step.assign(step)
    run_checkpoints.report_resumed(self.latest, step)
    self.saved_step = step
    return step

  def save(self, step):
    """Every process gathers; the chief writes checkpoint `step` (then prunes)."""
    values = self.trainer.full_values()
    prefix = "%s-%d" % (os.path.join(self.model_dir, DEFAULT_BASENAME), step)
    # every process checks what the chief's manager would refuse, so all stop alike
    checkpoint_manager.check_finite(collect_entries(values), prefix)
    self.saved_step = step
    if self.manager is None:
      self.latest = prefix  # the chief's checkpoint (for error messages)
      return None
    self._values.clear()
    self._values.update(values)
    self.latest = self.manager.save(step)
    run_checkpoints.report_saved(self.latest)
    return self.latest


class _SpmdRunner(step_loop.Runner):
  """This process's replicas of an SPMD run, as the step loop drives them."""

  def __init__(self, trainer, saver, graph, optimizer):
    self.trainer = trainer
    self.saver = saver
    self.graph = graph
    self.optimizer = optimizer
    self.model_dir = saver.model_dir
    self.is_chief = trainer.replicas.is_chief
    self._requested = 0  # this process's stop request, agreed in the next step
    self._agreed = 0  # the request every process agreed on in the last step

  def next_batch(self, iterator, step):
    return run_setup.next_batch(iterator, "train")

  def step(self, batch, want_rate):
    rate = float(train_loop.current_learning_rate(self.optimizer)) if want_rate else None
    # the rate above is the one this step uses; the step also agrees on the stop
    # requests made before it (one collective call per step, not two)
    loss, self._agreed = self.trainer.step_and_agree(self._requested, batch)
    self.saver.global_step.assign_add(1)
    return loss, rate

  def save(self, step):
    return self.saver.save(step)

  def saved_step(self):
    return self.saver.saved_step

  def latest_checkpoint(self):
    return self.saver.latest

  def make_metrics(self):
    impls = self.trainer.replicas.impls  # the profile: the chief's, into its model_dir
    return step_metrics.StepMetrics(self.graph, impls[0],
                                    self.model_dir if self.is_chief else None, impls)

  def traced_step(self):
    return self.trainer.traced_step(agreeing=True)

  def agree_stop(self, signum):
    """The stop every process agreed on in the step just run; `signum` (a request
    made during that step, or before the next) goes into the next step's agreement,
    so all processes still stop after the same step."""
    self._requested = signum
    return self._agreed
