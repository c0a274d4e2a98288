"""Train mode of the trainer in multi-client SPMD (cluster_setup.cluster_config.mode =
'spmd'): every process runs this loop for its own replicas (one per local device,
mesh_tf.cluster.multi_client), reads only its rows of each batch, and task 0 writes
the checkpoints and summaries.

What it shares with train_loop: the optimizer and learning rate (read from this
process's global step, which advances once per step after every replica ran it), the
model graph, the checkpoint format (full-shape, name-based, `global_step` included), so
a run resumes in either mode and restores on any mesh. What it lacks: eval during
training, microbatches, skipping non-finite steps, keep_checkpoint_max (every
checkpoint is kept) and the signal handling of train_loop.
"""
import math
import os

import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.cluster import input_share
from mesh_tf.cluster import spmd_training
from models.transformer import model_graph
from models.transformer import run_setup
from models.transformer import summaries
from models.transformer import train_loop
from models.transformer.context import ModeKeys


def share_of_train_data(train_dataset_fn, sequence_length, vocabulary, dataset_split,
                        batch_size, rows):
  """This process's rows [begin, end) of every global batch of the train data: the
  process runs the input pipeline itself and keeps only its examples (the others'
  are dropped before batching); nothing is sent between processes."""
  examples = run_setup.batched_dataset(train_dataset_fn, sequence_length, vocabulary,
                                       dataset_split, 1).unbatch()
  return input_share.share_of_dataset(examples, batch_size, rows)


def run_spmd_train(model_fn, replicas, model_dir, vocabulary, train_dataset_fn,
                   dataset_split, batch_size, sequence_length, variable_dtype,
                   train_steps, optimizer, learning_rate_schedule, save_checkpoints_steps,
                   iterations_per_loop, total_run_steps=None):
  """Trains to train_steps with this process's replicas; returns [(step, loss)]."""
  probe = run_setup.batched_dataset(train_dataset_fn, sequence_length, vocabulary,
                                    dataset_split, batch_size)  # for its feature keys
  global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
  mtf.optimize.set_global_step(global_step)
  rate = train_loop.make_learning_rate(learning_rate_schedule, global_step,
                                       total_run_steps or train_steps)
  graph = model_graph.ModelGraph(
      model_fn(), batch_size, sequence_length, run_setup.feature_keys(probe),
      ModeKeys.TRAIN, variable_dtype, optimizer=train_loop.make_optimizer(optimizer, rate))
  trainer = spmd_training.SpmdTrainer(graph, replicas)
  rows = input_share.batch_rows(replicas.impls[0], graph.placeholders["targets"].shape)
  step = 0
  latest = tf.train.latest_checkpoint(model_dir)
  if latest:
    step = int(trainer.restore(latest) or 0)
    global_step.assign(step)
    print("resumed from %s at step %d" % (latest, step), flush=True)
  print("training %s on mesh %s, layout %s (MultiClientMeshImpl: task %d of %d, %d "
        "replicas, rows [%d, %d) of each batch), to step %d"
        % (type(graph.model).__name__, replicas.mesh_shape.to_string,
           replicas.impls[0].layout_rules, replicas.task, len(replicas.addresses),
           len(replicas.impls), rows[0], rows[1], train_steps), flush=True)
  writer = summaries.ScalarWriter(model_dir) if replicas.is_chief else None
  iterator = iter(share_of_train_data(train_dataset_fn, sequence_length, vocabulary,
                                      dataset_split, batch_size, rows))
  history = []
  while step < train_steps:
    loss = trainer.step(run_setup.next_batch(iterator, "train"))
    global_step.assign_add(1)
    step += 1
    if not math.isfinite(loss):
      raise mtf.errors.NonFiniteError("loss is %s at step %d; training stopped" % (
          loss, step))
    if step % iterations_per_loop == 0 or step == train_steps:
      history.append((step, loss))
      print("step %d: loss %.6f" % (step, loss), flush=True)
      if writer is not None:
        writer.write(step, {"loss": loss})
    if step % save_checkpoints_steps == 0 or step == train_steps:
      path = trainer.save(os.path.join(model_dir, "model.ckpt"), global_step=step)
      if path:
        print("saved checkpoint %s" % path, flush=True)
  if writer is not None:
    writer.close()
  return history
