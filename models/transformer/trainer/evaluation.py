"""Eval: a checkpoint's mean loss, perplexity and token accuracy over N batches of a split,
and (encoder-decoder models, optionally) the exact-match accuracy of greedy decodes."""
import math
import os

import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.checkpoint import step_from_prefix
from models.transformer.trainer import decode_io
from models.transformer import decoding
from models.transformer import model_graph
from models.transformer.trainer import run_record
from models.transformer.trainer import run_setup
from models.transformer.trainer import summaries
from models.transformer.context import ModeKeys

# The metrics written to eval_results-<step>.txt and TensorBoard, when present.
METRICS = ("loss", "perplexity", "token_accuracy", "sequence_accuracy")


def restored_step(restored):
  """The global step of a restored checkpoint: the saved one, else its prefix's, else 0."""
  step = restored.global_step
  return step if step is not None else step_from_prefix(restored.path) or 0


def output_vocab_size(model):
  """The real (unpadded) output vocab size of a Unitransformer or Bitransformer."""
  decoder = model.decoder if model_graph.is_bitransformer(model) else model
  return decoder.output_vocab_size


def token_accuracy_counts(logits, targets, vocab_size, weights=None):
  """(correct, total) float32 mtf scalars of teacher-forced token accuracy: positions
  whose target is not padding (or, given a float32 mask like targets, where weights is
  1) count; correct where the argmax of the logits over the first vocab_size ids (the
  vocab dim's padded tail is never predicted) equals the target."""
  vocab_dim = logits.shape.dims[-1]
  masked = decoding.mask_padded_vocab(logits, vocab_dim, vocab_size)
  predictions = mtf.argmax(masked, vocab_dim)
  if weights is None:
    weights = mtf.cast(mtf.not_equal(targets, 0), tf.float32)
  weights = mtf.broadcast(weights, predictions.shape)
  correct = mtf.cast(mtf.equal(predictions, targets), tf.float32) * weights
  return mtf.reduce_sum(correct), mtf.reduce_sum(weights)


def eval_counts(graph):
  """mtf scalars (cross-entropy sum, correct, counted) of an eval ModelGraph's batch,
  over graph.weights' positions; perplexity is exp(cross-entropy sum / counted), a
  per-token mean as the original's neg_log_perplexity, whatever the loss normalizes by."""
  logits = mtf.cast(graph.logits, tf.float32)
  vocab_dim = logits.shape.dims[-1]
  xent = mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(graph.targets, vocab_dim, dtype=tf.float32), vocab_dim)
  xent_sum = mtf.reduce_sum(xent * mtf.broadcast(graph.weights, xent.shape))
  correct, total = token_accuracy_counts(graph.logits, graph.targets,
                                         output_vocab_size(graph.model), graph.weights)
  return xent_sum, correct, total


def export_step(graph, mesh_impl, tensors, jit_compile=None):
  """A tf.function(features) returning the tuple of mtf `tensors` of graph (a
  ModelGraph) lowered on mesh_impl with that batch; the variables are created (or
  found) eagerly first."""
  graph.lowering(mesh_impl)

  @tf.function(jit_compile=jit_compile)
  def step(features):
    lowering = graph.lowering(mesh_impl, features)
    return tuple(lowering.export_to_tf_tensor(t) for t in tensors)
  return step


def exact_matches(decoded, targets):
  """(matches, rows): how many rows of decoded equal their target row, counting only
  rows whose target is not all padding; both are cut after EOS and zero-padded to a
  common length."""
  decoded = decode_io.clean_decodes(decoded).numpy()
  targets = decode_io.clean_decodes(targets).numpy()
  length = max(decoded.shape[-1], targets.shape[-1])
  decoded = np.pad(decoded, [(0, 0), (0, length - decoded.shape[-1])])
  targets = np.pad(targets, [(0, 0), (0, length - targets.shape[-1])])
  real = targets.any(axis=-1)
  return int(np.sum(np.all(decoded == targets, axis=-1) & real)), int(np.sum(real))


class Evaluator:
  """An eval-mode graph of the model and a tf.function computing a batch's loss and
  token-accuracy counts; with decode_batches > 0 (encoder-decoder models only) also a
  greedy decoder scoring exact-match sequence accuracy on that many batches. Its
  variables are shared (by name) with any other graph lowered on mesh_impl."""

  def __init__(self, model_fn, mesh_impl, batch_size, sequence_length, feature_keys,
               variable_dtype, decode_batches=0):
    self.mesh_impl = mesh_impl
    self.decode_batches = int(decode_batches or 0)
    self.graph = graph = model_graph.ModelGraph(
        model_fn(), batch_size, sequence_length, feature_keys, ModeKeys.EVAL, variable_dtype)
    self.eval_step = export_step(graph, mesh_impl, (graph.loss,) + eval_counts(graph),
                                 mesh_impl.needs_xla)
    self.decode_fn = None
    if self.decode_batches:
      self.decode_fn = self._make_decode_fn(model_fn, batch_size, sequence_length,
                                            feature_keys, variable_dtype)

  def _make_decode_fn(self, model_fn, batch_size, sequence_length, feature_keys,
                      variable_dtype):
    if not model_graph.is_bitransformer(self.graph.model):
      raise mtf.MtfError("utils.run.eval_decode_batches=%d: sequence accuracy needs an "
                         "encoder-decoder model (model_type 'bitransformer')"
                         % self.decode_batches)
    if "inputs_segmentation" in feature_keys:
      raise mtf.MtfError("utils.run.eval_decode_batches=%d: sequence accuracy needs "
                         "unpacked eval data (one example per row), but the eval "
                         "dataset is packed" % self.decode_batches)
    length = model_graph.feature_length(sequence_length, "inputs")
    decode_graph = decode_io.DecodeGraph(model_fn(), batch_size, length, variable_dtype)
    return decode_graph.make_decode_fn(self.mesh_impl)

  def evaluate(self, dataset, steps, dataset_split="validation"):
    """Metrics over up to `steps` batches: {"loss", "perplexity", "token_accuracy",
    "batches"}, plus {"sequence_accuracy", "decoded_sequences"} when decoding."""
    losses, xent, correct, total = [], 0.0, 0.0, 0.0
    matches = rows = 0
    iterator = iter(dataset)
    for index in range(steps):
      try:
        batch = run_setup.next_batch(iterator, dataset_split)
      except StopIteration:
        break
      loss, batch_xent, batch_correct, batch_total = self.eval_step(batch)
      losses.append(float(loss))
      xent += float(batch_xent)
      correct += float(batch_correct)
      total += float(batch_total)
      if self.decode_fn is not None and index < self.decode_batches:
        decoded = self.decode_fn(batch["inputs"]).numpy()
        batch_matches, batch_rows = exact_matches(decoded, batch["targets"].numpy())
        matches += batch_matches
        rows += batch_rows
    if not losses:
      raise mtf.MtfError("eval split %r yielded no full batch" % dataset_split)
    loss = sum(losses) / len(losses)
    per_token = xent / total if total else loss
    results = {"loss": loss, "perplexity": math.exp(min(per_token, 700.0)),
               "token_accuracy": correct / total if total else 0.0,
               "batches": len(losses)}
    if self.decode_fn is not None:
      results.update(sequence_accuracy=matches / rows if rows else 0.0,
                     decoded_sequences=rows)
    return results


def describe(results):
  """One line of the metrics in results, e.g. "loss 1.2 perplexity 3.3 ..."."""
  parts = ["loss %.6f perplexity %.4f" % (results["loss"], results["perplexity"])]
  if "token_accuracy" in results:
    parts.append("token accuracy %.4f" % results["token_accuracy"])
  if "sequence_accuracy" in results:
    parts.append("sequence accuracy %.4f (%d sequences)"
                 % (results["sequence_accuracy"], results["decoded_sequences"]))
  return " ".join(parts)


def write_eval_results(model_dir, step, results, eval_dir_suffix=None):
  """Writes results to <model_dir>/eval[_suffix]/eval_results-<step>.txt and TensorBoard."""
  eval_dir = os.path.join(model_dir, "eval" + ("_" + eval_dir_suffix
                                               if eval_dir_suffix else ""))
  metrics = [k for k in METRICS if k in results]
  text = "".join("%s = %.9g\n" % (k, results[k]) for k in metrics)
  text += "global_step = %d\nbatches = %d\n" % (step, results["batches"])
  run_setup.write_text_atomically(os.path.join(eval_dir, "eval_results-%d.txt" % step),
                                  text)
  writer = summaries.ScalarWriter(eval_dir)
  writer.write(step, {"eval/" + k: results[k] for k in metrics})
  writer.close()
  return eval_dir


def run_eval(config, mesh_impl, checkpoint_path=None, eval_dir_suffix=None):
  """Restores a checkpoint (default: the latest in config.model_dir) and evaluates
  config.eval_steps batches of config.eval_dataset_fn's config.dataset_split (a
  run_config.RunConfig); returns Evaluator.evaluate's metrics plus "step" and
  "checkpoint"."""
  c = config
  model_dir, dataset_split = c.model_dir, c.dataset_split
  dataset = run_setup.batched_dataset(c.eval_dataset_fn, c.sequence_length, c.vocabulary,
                                      dataset_split, c.batch_size, repeat=False)
  evaluator = Evaluator(c.model_fn, mesh_impl, c.batch_size, c.sequence_length,
                        run_setup.feature_keys(dataset), c.variable_dtype,
                        decode_batches=c.eval_decode_batches)
  restored = run_record.restore(checkpoint_path or model_dir, mesh_impl)
  step = restored_step(restored)
  results = evaluator.evaluate(dataset, c.eval_steps, dataset_split)
  results.update(step=step, checkpoint=restored.path)
  write_eval_results(model_dir, step, results, eval_dir_suffix)
  print("eval %s (step %d, %d batches of %s): %s"
        % (restored.path, step, results["batches"], dataset_split, describe(results)),
        flush=True)
  return results
