"""Eval during SPMD training: every process evaluates its replicas on its own rows of
each eval batch; the graph reduces the losses and counts over the mesh, so every
process gets the same metrics."""
from mesh_tf.cluster import input_share
from models.transformer.trainer import evaluation
from models.transformer import model_graph
from models.transformer.trainer import run_setup
from models.transformer.context import ModeKeys


class SpmdEvaluator:
  """The eval graph of the model on every local replica of a ReplicaSet, sharing the
  train graph's variables by name; `evaluate` gives evaluation.Evaluator's metrics."""

  # no sequence accuracy here: greedy decoding is not wired to multi-client replicas
  decode_fn = None
  decode_batches = 0
  evaluate = evaluation.Evaluator.evaluate  # reads eval_step / decode_fn only

  def __init__(self, model_fn, replicas, batch_size, sequence_length, feature_keys,
               variable_dtype):
    self.replicas = replicas
    graph = model_graph.ModelGraph(model_fn(), batch_size, sequence_length, feature_keys,
                                   ModeKeys.EVAL, variable_dtype)
    tensors = (graph.loss,) + evaluation.eval_counts(graph)
    self.rows = input_share.batch_rows(replicas.impls[0],
                                       graph.placeholders["targets"].shape)
    # each finds the train graph's variables of its replica
    self._steps = [evaluation.export_step(graph, impl, tensors) for impl in replicas.impls]

  def eval_step(self, features):
    """(loss, cross-entropy sum, correct, counted) of one eval batch (this process's
    rows of it)."""
    return self.replicas.run(lambda r, impl: self._steps[r](features))[0]

  def dataset(self, eval_dataset_fn, sequence_length, vocabulary, batch_size):
    """This process's rows of every eval batch (of the validation split)."""
    examples = run_setup.batched_dataset(eval_dataset_fn, sequence_length, vocabulary,
                                         "validation", 1).unbatch()
    return input_share.share_of_dataset(examples, batch_size, self.rows)
