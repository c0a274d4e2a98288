"""Train mode in one process: the update step as one tf.function, checkpoints, resume.

The global step is a tf.Variable owned here and handed to mtf.optimize, so learning-rate
schedules read it when the graph is lowered (on every call of the traced step); it is
saved as `global_step` in every checkpoint. Starting again in the same model_dir resumes
from its latest complete checkpoint, on any mesh and layout. step_loop runs the steps
(non-finite losses, progress, saves, eval, signals).
"""
import numbers

import tensorflow as tf

import mesh_tf as mtf
from models import train_steps as shared_steps
from models.transformer.trainer import cluster_setup
from models.transformer.trainer import evaluation
from models.transformer import model_graph
from models.transformer.trainer import run_checkpoints
from models.transformer.trainer import run_record
from models.transformer.trainer import run_setup
from models.transformer.trainer import step_metrics
from models.transformer.trainer import step_loop
from models.transformer.trainer import stop_signals
from models.transformer.context import ModeKeys


def make_learning_rate(learning_rate_schedule, global_step, train_steps):
  """A zero-argument callable giving the rate at the current global step, or None."""
  if learning_rate_schedule is None:
    return None
  if isinstance(learning_rate_schedule, numbers.Number):
    rate = float(learning_rate_schedule)
    return lambda: tf.constant(rate, tf.float32)
  return lambda: tf.cast(learning_rate_schedule(step=global_step,
                                                total_train_steps=train_steps), tf.float32)


def make_optimizer(optimizer, learning_rate):
  """An Optimizer instance: optimizer may be an instance, a class/factory, or None
  (AdafactorOptimizer, as in the original trainer)."""
  if isinstance(optimizer, mtf.optimize.Optimizer):
    return optimizer
  factory = optimizer or mtf.optimize.AdafactorOptimizer
  return factory() if learning_rate is None else factory(learning_rate=learning_rate)


def current_learning_rate(optimizer):
  """The optimizer's learning rate now, as a float32 tf.Tensor (for summaries)."""
  rate = getattr(optimizer, "learning_rate", None)
  if callable(rate) and not isinstance(rate, tf.Variable):
    rate = rate()
  return tf.cast(0.0 if rate is None else rate, tf.float32)


class Trainer:
  """Builds the train graph and step once; `train(steps)` runs and checkpoints.

  model_fn returns a fresh model (one per graph); train_steps is the global step to stop
  at, total_run_steps the schedules' total (default train_steps); the others are as
  utils.run takes them. skip_nonfinite_updates: a step whose loss is NaN/Inf leaves
  every variable unchanged (else training stops with an error).
  """

  def __init__(self, model_fn, mesh_impl, model_dir, batch_size, sequence_length,
               feature_keys, variable_dtype, train_steps, optimizer=None,
               learning_rate_schedule=None, save_checkpoints_steps=1000,
               keep_checkpoint_max=5, iterations_per_loop=100, num_microbatches=1,
               skip_nonfinite_updates=False, total_run_steps=None):
    self.mesh_impl = mesh_impl
    self.model_dir = model_dir
    self.train_steps = train_steps
    self.save_checkpoints_steps = save_checkpoints_steps
    self.iterations_per_loop = iterations_per_loop
    with cluster_setup.variable_scope(mesh_impl):  # replica steps read it on a TPU
      self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="global_step")
    mtf.optimize.set_global_step(self.global_step)
    self.optimizer = make_optimizer(optimizer, make_learning_rate(
        learning_rate_schedule, self.global_step, total_run_steps or train_steps))
    self.graph = model_graph.ModelGraph(
        model_fn(), batch_size, sequence_length, feature_keys, ModeKeys.TRAIN,
        variable_dtype, optimizer=self.optimizer, num_microbatches=num_microbatches)
    with cluster_setup.variable_scope(mesh_impl):  # a TPU strategy's scope, if any
      self.graph.lowering(mesh_impl)  # creates the variables eagerly, before any trace
    self.manager = run_checkpoints.open_manager(model_dir, mesh_impl, self.global_step,
                                                keep_checkpoint_max)
    self.skip_nonfinite_updates = skip_nonfinite_updates
    graph = self.graph

    @tf.function(jit_compile=mesh_impl.needs_xla)
    def train_step(features):
      rate = current_learning_rate(self.optimizer)
      loss = cluster_setup.run_replicated(  # through strategy.run on a TPU strategy
          mesh_impl, lambda f: shared_steps.lower_train_step(
              graph.lowering(mesh_impl, f), graph.loss, graph.update_ops,
              skip_nonfinite=skip_nonfinite_updates), features)
      self.global_step.assign_add(1)
      return loss, rate
    self.train_step = train_step

  def restore(self, init_checkpoint=None):
    """Resumes from model_dir's latest checkpoint, else loads init_checkpoint's model
    variables (if given); returns the global step training starts at."""
    run_record.check_checkpoint(self.manager.latest_checkpoint)
    try:
      step = self.manager.restore_or_initialize()
    except mtf.CheckpointError as e:
      raise mtf.CheckpointError(
          str(e).split(" -- ")[0], tensor=e.tensor, file=e.file,
          hint="the checkpoints in %s belong to a model of another configuration: train "
               "this one in a new --model_dir (utils.run.init_checkpoint can start it "
               "from those weights where they fit), or use the configuration that wrote "
               "them" % self.model_dir) from e
    if step is not None:
      self.global_step.assign(step)
      run_checkpoints.report_resumed(self.manager.latest_checkpoint, step)
      return step
    if init_checkpoint:
      result = mtf.restore_checkpoint(init_checkpoint, self.warm_start_variables(),
                                      allow_missing=True)
      print("initialized %d variables from %s" % (len(result.names), result.path),
            flush=True)
    return int(self.global_step.numpy())

  def warm_start_variables(self):
    """{init checkpoint key: variable} of the variables init_checkpoint loads: those
    utils.should_load_variable accepts, under utils.init_checkpoint_variable_mapping's
    key (gin-configurable, as in the original; a None key skips the variable)."""
    from models.transformer import utils  # pylint: disable=g-import-not-at-top
    mapped = {}
    for name, variable in self.mesh_impl.variable_store.items():
      if not utils.should_load_variable(name):
        continue
      key = utils.init_checkpoint_variable_mapping(name)
      if key is not None:
        mapped[key] = variable
    return mapped

  def train(self, dataset, evaluator=None, eval_dataset=None, eval_steps=0, stream=None):
    """Runs steps until train_steps (step_loop.run_steps); returns [(step, loss)] of the
    progress lines. NonFiniteError at a NaN/Inf loss unless skip_nonfinite_updates."""
    step = int(self.global_step.numpy())
    if step_loop.nothing_to_do(step, self.train_steps):
      return []
    config = step_loop.LoopConfig(self.train_steps, self.save_checkpoints_steps,
                                  self.iterations_per_loop, self.skip_nonfinite_updates)
    runner = _TrainerRunner(self, step)
    if evaluator is not None and eval_steps:
      runner.eval_plan = step_loop.EvalPlan(evaluator, eval_dataset, eval_steps)
    with stop_signals.GracefulStop() as stop:
      return step_loop.run_steps(runner, config, step, iter(dataset), stop, stream)

  def _save(self, step):
    path = self.manager.save()
    run_checkpoints.report_saved(path)
    return path

  def _data_error(self, error, step, started_at):
    """An MtfError naming the train data file that failed and the last good checkpoint,
    saved first at step (reading the next batch changed no variable)."""
    from models.transformer import dataset as dataset_lib  # pylint: disable=g-import-not-at-top
    what, data_file = dataset_lib.read_error_summary(error)
    last = self.manager.latest_checkpoint
    if step > started_at and last != "%s-%d" % (self.manager.checkpoint_prefix, step):
      try:
        last = self._save(step)
      except mtf.MtfError as e:
        print("could not save step %d: %s" % (step, e), flush=True)
    where = ("the last good checkpoint is %s" % last if last else
             "no checkpoint was written in %s" % self.model_dir)
    return mtf.MtfError(
        "reading the train data failed after step %d: %s; training stopped; %s (fix the "
        "data and run the same command again to resume)" % (step, what, where),
        file=data_file)


class _TrainerRunner(step_loop.Runner):
  """A Trainer in one process, as the step loop drives it."""

  def __init__(self, trainer, started_at):
    self.trainer = trainer
    self.started_at = started_at
    self.model_dir = trainer.model_dir
    self.graph = trainer.graph

  def next_batch(self, iterator, step):
    try:
      return run_setup.next_batch(iterator, "train")
    except StopIteration:  # the train data repeats: it had not one full batch
      raise mtf.MtfError("the train dataset has no full batch of %d examples (is its "
                         "data empty?)" % self.graph.batch_size) from None
    except (mtf.MtfError, tf.errors.OpError) as e:  # e.g. a data file deleted
      raise self.trainer._data_error(e, step, self.started_at) from e  # pylint: disable=protected-access

  def step(self, batch, want_rate):
    loss, rate = self.trainer.train_step(batch)
    # the step has run; reading its loss costs nothing more
    return float(loss), float(rate) if want_rate else None

  def save(self, step):
    return self.trainer._save(step)  # pylint: disable=protected-access

  def saved_step(self):
    latest = self.trainer.manager.latest_checkpoint
    return int(latest.rsplit("-", 1)[1]) if latest else None

  def latest_checkpoint(self):
    return self.trainer.manager.latest_checkpoint

  def make_metrics(self):
    return step_metrics.StepMetrics(self.graph, self.trainer.mesh_impl, self.model_dir)

  def traced_step(self):
    return self.trainer.train_step


def run_train(config, mesh_impl):
  """Train mode of utils.run (which holds model_dir's lock around it) for a
  run_config.RunConfig on mesh_impl; returns the trainer's [(step, loss)] history."""
  c = config
  dataset = run_setup.batched_dataset(c.train_dataset_fn, c.sequence_length,
                                      c.vocabulary, c.dataset_split, c.batch_size)
  keys = run_setup.feature_keys(dataset)
  trainer = Trainer(c.model_fn, mesh_impl, c.model_dir, c.batch_size, c.sequence_length,
                    keys, c.variable_dtype, c.train_steps, optimizer=c.optimizer,
                    learning_rate_schedule=c.learning_rate_schedule,
                    save_checkpoints_steps=c.save_checkpoints_steps,
                    keep_checkpoint_max=c.keep_checkpoint_max,
                    iterations_per_loop=c.iterations_per_loop,
                    num_microbatches=c.num_microbatches,
                    skip_nonfinite_updates=c.skip_nonfinite_updates,
                    total_run_steps=c.total_run_steps)
  evaluator = eval_dataset = None
  if c.eval_dataset_fn is not None and c.eval_steps:
    eval_dataset = run_setup.batched_dataset(c.eval_dataset_fn, c.sequence_length,
                                             c.vocabulary, "validation", c.batch_size)
    evaluator = evaluation.Evaluator(
        c.model_fn, mesh_impl, c.batch_size, c.sequence_length,
        run_setup.feature_keys(eval_dataset), c.variable_dtype,
        decode_batches=c.eval_decode_batches)
  trainer.restore(c.init_checkpoint)  # before anything is written to model_dir
  run_setup.write_operative_config(c.model_dir, c.operative_config_extra)
  print("training %s on mesh %s, layout %s (%s), to step %d"
        % (type(trainer.graph.model).__name__, mesh_impl.shape.to_string,
           mesh_impl.layout_rules, type(mesh_impl).__name__, c.train_steps), flush=True)
  trained = int(trainer.global_step.numpy())
  if trained < c.train_steps:  # each step took one global batch: skip those trained on
    dataset = run_setup.skip_trained_batches(dataset, trained, c.batch_size)
  return trainer.train(dataset, evaluator, eval_dataset, c.eval_steps)
