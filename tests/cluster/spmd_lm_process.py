"""One process of a multi-client SPMD run of the tiny LM (mesh batch:2;model:4 over the
processes), for tests/cluster/test_spmd_cluster.py.

  python tests/cluster/spmd_lm_process.py CLUSTER TASK MODEL_DIR STEPS [TIMEOUT [MESH
      [PROGRAM]]]

Reads only its share of each batch, trains STEPS steps, has the chief save a checkpoint
(MODEL_DIR/model.ckpt-STEPS) and prints one JSON line: losses and the rows it read. If
MODEL_DIR holds a checkpoint, it resumes from it.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

from mesh_tf.cluster import multi_client  # pylint: disable=g-import-not-at-top,wrong-import-position

MESH = "batch:2;model:4"
LAYOUT = "batch:batch;d_ff:model;heads:model;vocab:model"
SIZES = dict(batch=8, length=8, vocab=32, d_model=16, heads=8, d_kv=4, d_ff=32,
             num_layers=1)


def main(cluster, task, model_dir, steps, timeout=60.0, mesh=MESH, program="auto"):
  replicas = multi_client.ReplicaSet(mesh, LAYOUT, cluster, task, timeout=timeout,
                                     program=program)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tf.cluster import input_share, spmd_training  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig(**SIZES)
  trainer = spmd_training.SpmdTrainer(mtf_model.TinyLmModel(c), replicas)
  start = 0
  if tf.train.latest_checkpoint(model_dir):
    start = trainer.restore(model_dir)
  rows = input_share.batch_rows(replicas.impls[0],
                                "batch:%d;length:%d" % (c.batch, c.length))
  batch = config.synthetic_batch(c)
  inputs = tf.constant(batch[rows[0]:rows[1], :-1])
  targets = tf.constant(batch[rows[0]:rows[1], 1:])
  losses = []
  for step in range(start, steps):
    losses.append(trainer.step(inputs, targets))
    print("step %d loss %.6f" % (step + 1, losses[-1]), flush=True)
    if (step + 1) % 2 == 0:
      trainer.save(os.path.join(model_dir, "model.ckpt"), global_step=step + 1)
  # one more step (after the last checkpoint) that also agrees on a per-task value
  _, agreed = trainer.step_and_agree(10 + task, inputs, targets)
  print(json.dumps({"task": task, "start": start, "losses": losses, "rows": rows,
                    "agreed": agreed,
                    "impl": type(replicas.impls[0]).__name__,
                    "threads": replicas.threads and list(replicas.threads),
                    "pools": [tf.config.threading.get_intra_op_parallelism_threads(),
                              tf.config.threading.get_inter_op_parallelism_threads()],
                    "primitives": primitives(replicas),
                    "random_init": random_init(replicas)}),
        flush=True)


class RandomInitModel:
  """One variable with a random initializer (split on `model`, copied on `batch`)."""

  def __init__(self):
    import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.graph = mtf.Graph()
    self.mesh = mtf.Mesh(self.graph, "mesh")
    self.w = mtf.get_variable(self.mesh, "w", "d_model:4;d_ff:8",
                              initializer=tf.random_normal_initializer())
    self.loss = mtf.reduce_sum(self.w)
    self.update_ops = []

  def lowering(self, mesh_impl, *batch):
    import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
    del batch
    return mtf.Lowering(self.graph, {self.mesh: mesh_impl})


def random_init(replicas):
  """Every local replica's (or the one program's) full value of RandomInitModel's
  variable after SpmdTrainer made the copies agree."""
  from mesh_tf.cluster import spmd_training  # pylint: disable=g-import-not-at-top
  trainer = spmd_training.SpmdTrainer(RandomInitModel(), replicas)
  values = replicas.run(lambda r, impl: trainer._gathers[r]()["w"])  # pylint: disable=protected-access
  return [v.numpy().tolist() for v in values]


def primitive_input(pnum):
  """The [2, 4] float slice processor pnum starts from in `primitives`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  return (np.arange(8, dtype=np.float32).reshape([2, 4]) * (pnum + 1) +
          10 * pnum).tolist()


def apply_primitives(impl, x):
  """{name: laid-out result} of each collective primitive applied to x (a 2-d mesh)."""
  rows, cols = impl.shape.to_integer_list
  return {"allreduce_max_0": impl.allreduce(x, [0], "MAX"),
          "allreduce_sum_01": impl.allreduce(x, [0, 1], "SUM"),
          "allconcat_1_0": impl.allconcat(x, 1, 0),
          "allconcat_0_1": impl.allconcat(x, 0, 1),
          "alltoall_1_1_0": impl.alltoall(x, 1, 1, 0),
          "alltoall_0_1_0": impl.alltoall(x, 0, 1, 0),
          "reduce_scatter_0_1": impl.reduce_scatter(x, 0, 1),
          "receive_1_shift": impl.receive(x, 1, [None] + list(range(cols - 1))),
          "receive_0_reverse": impl.receive(x, 0, list(reversed(range(rows))))}


def primitives(replicas):
  """{name: [one result slice per local processor]} of apply_primitives."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def run(r, impl):
    @tf.function
    def fn():
      x = impl.LaidOutTensor([tf.constant(primitive_input(p)) for p in impl.pnums])
      return {k: v.tensor_list for k, v in apply_primitives(impl, x).items()}
    return {k: [t.numpy().tolist() for t in v] for k, v in fn().items()}
  results = replicas.run(run)
  return {k: sum((r[k] for r in results), []) for k in results[0]}


if __name__ == "__main__":
  from mesh_tf.cluster import spec  # pylint: disable=g-import-not-at-top
  try:
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
         *([float(a) for a in sys.argv[5:6]] + sys.argv[6:8]))
  except spec.ClusterError as e:
    sys.stderr.write("error: %s\n" % e)
    sys.stdout.flush()
    os._exit(1)  # pylint: disable=protected-access
