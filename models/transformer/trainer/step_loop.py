"""The one train-step loop of the trainer, for every execution mode.

A mode (one process: train_loop; multi-client SPMD: spmd_train_loop) provides a
`Runner`. `run_steps` applies the policy they share: stop or skip at a non-finite loss,
report progress and summaries, save every save_checkpoints_steps (and evaluate after
each save), and on SIGTERM / Ctrl-C in any process save and exit with 143 / 130.
"""
import abc
import dataclasses
import math

import mesh_tf as mtf
from models.transformer.trainer import evaluation
from models.transformer.trainer import progress as progress_lib
from models.transformer.trainer import summaries


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """How long to train and how often to report and save."""
  train_steps: int
  save_checkpoints_steps: int
  iterations_per_loop: int
  skip_nonfinite_updates: bool = False


@dataclasses.dataclass
class EvalPlan:
  """Evaluation after every checkpoint: an evaluator with `evaluate(dataset, steps)`."""
  evaluator: object
  dataset: object
  steps: int


class Runner(abc.ABC):
  """What an execution mode gives the step loop."""

  model_dir = None
  graph = None  # the train ModelGraph
  is_chief = True
  eval_plan = None  # an EvalPlan, or None

  @abc.abstractmethod
  def next_batch(self, iterator, step):
    """The next batch of the train data (step: the steps completed so far)."""

  @abc.abstractmethod
  def step(self, batch, want_rate):
    """Runs one train step (the global step advances); returns (loss as a float, the
    learning rate the step used as a float when want_rate, else None)."""

  @abc.abstractmethod
  def save(self, step):
    """Writes checkpoint `step` (in every process that takes part); returns its path."""

  @abc.abstractmethod
  def saved_step(self):
    """The step of the last checkpoint this run wrote or resumed from, or None."""

  @abc.abstractmethod
  def latest_checkpoint(self):
    """The path of the last good checkpoint, or None."""

  @abc.abstractmethod
  def make_metrics(self):
    """A step_metrics.StepMetrics for this mode's devices."""

  @abc.abstractmethod
  def traced_step(self):
    """The tf.function of one step (step_metrics counts its FLOPs)."""

  def agree_stop(self, signum):
    """The signal number every process stops for after this step (0: go on); one
    process needs no agreement."""
    return signum


def nothing_to_do(step, train_steps):
  """True (and says so) when the global step already reaches train_steps."""
  if step < train_steps:
    return False
  print("global step %d already reaches train_steps %d; nothing to do"
        % (step, train_steps), flush=True)
  return True


def nonfinite_error(loss, step, latest_checkpoint, model_dir):
  """The NonFiniteError of a NaN/Inf loss at step, naming the last good checkpoint."""
  where = ("the last good checkpoint is %s" % latest_checkpoint if latest_checkpoint
           else "no checkpoint was written in %s" % model_dir)
  return mtf.errors.NonFiniteError(
      "loss is %s at step %d; training stopped and nothing was saved after it; %s"
      % (loss, step, where),
      hint="lower the learning rate (or clip gradients), or bind "
           "utils.run.skip_nonfinite_updates = True to skip such steps")


def evaluate(eval_plan, step, model_dir, is_chief):
  """Runs the evaluation of eval_plan; the chief writes its results; all print them."""
  results = eval_plan.evaluator.evaluate(eval_plan.dataset, eval_plan.steps)
  if is_chief:
    evaluation.write_eval_results(model_dir, step, results)
  print("eval at step %d: %s" % (step, evaluation.describe(results)), flush=True)


def run_steps(runner, config, step, iterator, stop, stream=None):
  """Trains from global step `step` to config.train_steps, or until `stop` (a
  stop_signals.GracefulStop) saw a signal in any process; returns [(step, loss)] of the
  progress lines."""
  writer = summaries.ScalarWriter(runner.model_dir) if runner.is_chief else None
  metrics = runner.make_metrics()
  if writer is not None:
    writer.write(step, metrics.predicted)
  progress = progress_lib.Progress(config.train_steps, runner.graph.tokens_per_batch(),
                                   stream=stream, metrics=metrics)
  progress.start(step)
  history, skipped, signum = [], 0, 0
  while step < config.train_steps and not signum:
    reporting = ((step + 1) % config.iterations_per_loop == 0 or
                 step + 1 == config.train_steps)
    batch = runner.next_batch(iterator, step)
    metrics.before_step(step + 1)
    loss, rate = runner.step(batch, reporting)
    step += 1
    metrics.after_step(step, runner.traced_step(), batch)
    if not math.isfinite(loss):
      if not config.skip_nonfinite_updates:
        raise nonfinite_error(loss, step, runner.latest_checkpoint(), runner.model_dir)
      skipped += 1
      print("step %d: loss is %s; its update was skipped (%d step(s) skipped so far)"
            % (step, loss, skipped), flush=True)
    if reporting:
      tokens_per_second = progress.report(step, loss, rate)
      history.append((step, loss))
      if writer is not None:
        writer.write(step, dict(progress.scalars, loss=loss, learning_rate=rate,
                                tokens_per_second=tokens_per_second))
    if step % config.save_checkpoints_steps == 0 or step == config.train_steps:
      runner.save(step)
      if runner.eval_plan is not None:
        evaluate(runner.eval_plan, step, runner.model_dir, runner.is_chief)
    # a signal to any process stops all of them after this same step
    signum = runner.agree_stop(stop.signum or 0)
  metrics.close(step)
  if writer is not None:
    writer.close()
  if signum:
    if runner.saved_step() != step:
      runner.save(step)
    stop.signum = signum  # the signal some process got: every process exits so
    stop.exit("stopped at step %d by %s; resume by running the same command again"
              % (step, "Ctrl-C" if signum == 2 else "SIGTERM"))
  return history
