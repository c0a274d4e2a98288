"""Eval: the mean loss and perplexity of a checkpoint over N batches of a split."""
import math
import os

import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.checkpoint import step_from_prefix
from models.transformer import model_graph
from models.transformer import run_setup
from models.transformer import summaries
from models.transformer.context import ModeKeys


class Evaluator:
  """An eval-mode graph of the model and a tf.function computing a batch's loss.

  Its variables are shared (by name) with any other graph lowered on mesh_impl.
  """

  def __init__(self, model_fn, mesh_impl, batch_size, sequence_length, feature_keys,
               variable_dtype):
    self.mesh_impl = mesh_impl
    self.graph = model_graph.ModelGraph(model_fn(), batch_size, sequence_length,
                                        feature_keys, ModeKeys.EVAL, variable_dtype)
    self.graph.lowering(mesh_impl)  # creates (or finds) the variables eagerly

    @tf.function(jit_compile=isinstance(mesh_impl, mtf.GSPMDMeshImpl))
    def eval_step(features):
      return self.graph.lowering(mesh_impl, features).export_to_tf_tensor(self.graph.loss)
    self.eval_step = eval_step

  def evaluate(self, dataset, steps, dataset_split="validation"):
    """{"loss", "perplexity", "batches"} averaged over up to `steps` batches."""
    losses = []
    iterator = iter(dataset)
    for _ in range(steps):
      try:
        batch = run_setup.next_batch(iterator, dataset_split)
      except StopIteration:
        break
      losses.append(float(self.eval_step(batch)))
    if not losses:
      raise mtf.MtfError("eval split %r yielded no full batch" % dataset_split)
    loss = sum(losses) / len(losses)
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)),
            "batches": len(losses)}


def write_eval_results(model_dir, step, results, eval_dir_suffix=None):
  """Writes results to <model_dir>/eval[_suffix]/eval_results-<step>.txt and TensorBoard."""
  eval_dir = os.path.join(model_dir, "eval" + ("_" + eval_dir_suffix
                                               if eval_dir_suffix else ""))
  text = "".join("%s = %.9g\n" % (k, results[k]) for k in ("loss", "perplexity"))
  text += "global_step = %d\nbatches = %d\n" % (step, results["batches"])
  run_setup.write_text_atomically(os.path.join(eval_dir, "eval_results-%d.txt" % step),
                                  text)
  writer = summaries.ScalarWriter(eval_dir)
  writer.write(step, {"eval/loss": results["loss"],
                      "eval/perplexity": results["perplexity"]})
  writer.close()
  return eval_dir


def run_eval(model_fn, mesh_impl, model_dir, checkpoint_path, vocabulary, eval_dataset_fn,
             dataset_split, batch_size, sequence_length, variable_dtype, eval_steps,
             eval_dir_suffix=None):
  """Restores a checkpoint (default: the latest in model_dir) and evaluates it.

  Returns {"loss", "perplexity", "batches", "step", "checkpoint"}.
  """
  dataset = run_setup.batched_dataset(eval_dataset_fn, sequence_length, vocabulary,
                                      dataset_split, batch_size, repeat=False)
  evaluator = Evaluator(model_fn, mesh_impl, batch_size, sequence_length,
                        run_setup.feature_keys(dataset), variable_dtype)
  restored = mtf.restore_checkpoint(checkpoint_path or model_dir, mesh_impl)
  step = restored.global_step
  if step is None:
    step = step_from_prefix(restored.path) or 0
  results = evaluator.evaluate(dataset, eval_steps, dataset_split)
  results.update(step=step, checkpoint=restored.path)
  write_eval_results(model_dir, step, results, eval_dir_suffix)
  print("eval %s (step %d, %d batches of %s): loss %.6f perplexity %.4f"
        % (restored.path, step, results["batches"], dataset_split, results["loss"],
           results["perplexity"]), flush=True)
  return results
