"""`MeshEstimator`: what the original's TPUEstimator did for its Transformer, on TF 2.

The original's entry points (`utils.train_model`, `eval_model`, ...) take the
MeshEstimator `utils.get_estimator` makes. Each method builds (once) the graph of its
mode, restores the checkpoint asked for (the latest by default) and runs it.
"""
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.trainer import decode_io
from models.transformer.trainer import evaluation
from models.transformer.trainer import model_dir_guard
from models.transformer import model_graph
from models.transformer.trainer import run_setup
from models.transformer.trainer import train_loop
from models.transformer.context import ModeKeys


def token_log_probs(graph):
  """float32 mtf [batch, length]: log p(target) at each position of a ModelGraph's
  logits (the softmax over the whole vocab dim, as the model's loss takes it); the
  targets are the graph's (a "delimited_lm"'s [inputs, targets] sequences)."""
  logits = mtf.cast(graph.logits, tf.float32)
  vocab_dim = logits.shape.dims[-1]
  log_probs = logits - mtf.reduce_logsumexp(logits, reduced_dim=vocab_dim)
  return mtf.reduce_sum(log_probs * mtf.one_hot(graph.targets, vocab_dim, dtype=tf.float32),
                        reduced_dim=vocab_dim)


class MeshEstimator:
  """The estimator role of the original's entry points (see the module docstring).

  Args:
    model_fn: zero-argument callable returning a fresh Unitransformer/Bitransformer.
    batch_size, sequence_length: the batch shape (sequence_length an int or a dict).
    optimizer ... iterations_per_loop: as utils.run takes them.
    init_checkpoint: weights to start training from when model_dir has none.
    score_in_predict_mode: predict() returns scores instead of decodes.
  """

  def __init__(self, model_fn, mesh_impl, model_dir, batch_size, sequence_length,
               variable_dtype, optimizer=None, learning_rate_schedule=None,
               keep_checkpoint_max=5, save_checkpoints_steps=1000,
               iterations_per_loop=100, init_checkpoint=None, score_in_predict_mode=False):
    for name, value in list(locals().items()):  # each argument, as its attribute
      if name != "self":
        setattr(self, name, value)
    self._built = {}

  def latest_checkpoint(self):
    """The newest complete checkpoint of model_dir (None if it has none), as a
    discovery.Latest: restoring it reads the newest one then, should it be pruned."""
    return mtf.checkpoint.discovery.latest(self.model_dir, report=None)

  def _restore(self, checkpoint_path):
    """Restores the variables built so far on mesh_impl (build a mode's graph first)."""
    return mtf.restore_checkpoint(checkpoint_path or self.model_dir, self.mesh_impl)

  def train(self, dataset, max_steps):
    """Trains on a batched feature-dict dataset until global step max_steps (resuming
    from model_dir); returns the [(step, loss)] progress history."""
    with model_dir_guard.claimed_model_dir(self.model_dir):
      trainer = train_loop.Trainer(
          self.model_fn, self.mesh_impl, self.model_dir, self.batch_size,
          self.sequence_length, run_setup.feature_keys(dataset), self.variable_dtype,
          max_steps, optimizer=self.optimizer,
          learning_rate_schedule=self.learning_rate_schedule,
          save_checkpoints_steps=self.save_checkpoints_steps,
          keep_checkpoint_max=self.keep_checkpoint_max,
          iterations_per_loop=self.iterations_per_loop)
      trainer.restore(self.init_checkpoint)
      run_setup.write_operative_config(self.model_dir)
      return trainer.train(dataset)

  def evaluate(self, dataset, steps, checkpoint_path=None):
    """Eval metrics (loss, perplexity, token accuracy) of a checkpoint on a batched
    dataset, plus "step" and "checkpoint"."""
    keys = tuple(run_setup.feature_keys(dataset))
    if ("eval", keys) not in self._built:
      self._built[("eval", keys)] = evaluation.Evaluator(
          self.model_fn, self.mesh_impl, self.batch_size, self.sequence_length, keys,
          self.variable_dtype)
    restored = self._restore(checkpoint_path)
    results = self._built[("eval", keys)].evaluate(dataset, steps)
    results.update(step=evaluation.restored_step(restored), checkpoint=restored.path)
    return results

  def _score_fn(self, keys):
    if ("score", keys) not in self._built:
      graph = model_graph.ModelGraph(self.model_fn(), self.batch_size,
                                     self.sequence_length, keys, ModeKeys.EVAL,
                                     self.variable_dtype)
      self._built[("score", keys)] = evaluation.export_step(
          graph, self.mesh_impl, (token_log_probs(graph), graph.weights))
    return self._built[("score", keys)]

  def score(self, input_fn, checkpoint_path=None):
    """Yields {"inputs", "targets", "scores"} per example of input_fn's batches: the
    log-likelihood of the targets, summed where the batch's "weights" (if any) are
    nonzero, else where targets are not padding (a "delimited_lm": its targets part)."""
    restored = False
    for batch in input_fn({"batch_size": self.batch_size}):
      batch = {k: tf.cast(v, tf.int32) for k, v in batch.items()}
      keys = tuple(sorted(k for k in batch if k in model_graph.FEATURE_KEYS))
      score_fn = self._score_fn(keys)  # creates the variables before the restore
      if not restored:
        restored = bool(self._restore(checkpoint_path))
      log_probs, counted = score_fn({k: batch[k] for k in keys})
      log_probs = log_probs.numpy()
      weights = (batch["weights"] if "weights" in batch else counted).numpy()
      for i, row_scores in enumerate((log_probs * weights).sum(axis=1)):
        row = {k: batch[k][i].numpy() for k in ("inputs", "targets") if k in batch}
        row["scores"] = float(row_scores)
        yield row

  def _decode_fn(self, length):
    if ("decode", length) not in self._built:
      model = self.model_fn()
      continuation = 0
      if model_graph.model_type_of(model) == "delimited_lm":  # room for the targets
        continuation = model_graph.feature_length(self.sequence_length, "targets")
      graph = decode_io.DecodeGraph(model, self.batch_size, length, self.variable_dtype,
                                    continuation_length=continuation, mode="predict",
                                    **decode_io.decode_options())
      self._built[("decode", length)] = graph.make_decode_fn(self.mesh_impl)
    return self._built[("decode", length)]

  def predict(self, input_fn, checkpoint_path=None):
    """Yields one dict per example of input_fn's batches: {"inputs", "outputs"} (the
    decoded ids), or score()'s rows when score_in_predict_mode. input_fn(params)
    returns a dataset of int32 [batch_size, length] feature dicts."""
    if self.score_in_predict_mode:
      yield from self.score(input_fn, checkpoint_path)
      return
    restored = False
    for batch in input_fn({"batch_size": self.batch_size}):
      inputs = tf.cast(batch["inputs"], tf.int32)
      decode_fn = self._decode_fn(int(inputs.shape[1]))
      if not restored:
        restored = bool(self._restore(checkpoint_path))
      outputs = decode_fn(inputs).numpy()
      for i in range(outputs.shape[0]):
        yield {"inputs": inputs[i].numpy(), "outputs": outputs[i]}

  def export(self, export_dir, vocabulary, checkpoint_path=None, batch_size=None):
    """Writes a SavedModel decoding ids and text (export.run_export); returns its path."""
    from models.transformer.trainer import export  # pylint: disable=g-import-not-at-top
    return export.run_export(self.model_fn, self.model_dir, checkpoint_path, vocabulary,
                             batch_size or self.batch_size, self.sequence_length,
                             self.variable_dtype, export_dir)
