"""Eval during SPMD training (spmd_train_loop): every process evaluates its replicas on
its own rows of each eval batch; the losses and token counts come out whole (the graph
reduces them over the mesh), so every process gets the same metrics and the chief
writes them, as train_loop's Evaluator does in one process."""
import tensorflow as tf

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
    counts = evaluation.eval_counts(graph)
    self.rows = input_share.batch_rows(replicas.impls[0],
                                       graph.placeholders["targets"].shape)

    def make_step(impl):
      graph.lowering(impl)  # finds the train graph's variables of this replica

      @tf.function
      def eval_step(features):
        lowering = graph.lowering(impl, features)
        return tuple(lowering.export_to_tf_tensor(t) for t in (graph.loss,) + counts)
      return eval_step
    self._steps = [make_step(impl) for impl in replicas.impls]

  def eval_step(self, features):
    """(loss, cross-entropy sum, correct, counted) of one eval batch (this process's
    rows of it)."""
    return self.replicas.run(lambda r, impl: self._steps[r](features))[0]

  def dataset(self, eval_dataset_fn, sequence_length, vocabulary, batch_size):
    """This process's rows of every eval batch (of the validation split)."""
    examples = run_setup.batched_dataset(eval_dataset_fn, sequence_length, vocabulary,
                                         "validation", 1).unbatch()
    return input_share.share_of_dataset(examples, batch_size, self.rows)
