"""Client run by test_placement_cluster: the README MLP on one device, then on mesh
rows:2;cols:4 over the given cluster's 8 devices, from the same initial weights.

    python tests/cluster/mlp_client.py CLUSTER MODEL_DIR

Prints one JSON line: both runs' losses, the cluster run's final eval loss, the
checkpoint path, the devices, and the error connecting with a mesh that does not fit.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import mesh_tf as mtf  # pylint: disable=g-import-not-at-top,wrong-import-position
from mesh_tf import cluster  # pylint: disable=g-import-not-at-top,wrong-import-position
from models.mlp.model import MlpModel, synthetic_digits  # pylint: disable=g-import-not-at-top,wrong-import-position

MESH, LAYOUT, BATCH, STEPS = "rows:2;cols:4", "batch:rows;hidden:cols", 32, 4


def train(impl):
  tf.random.set_seed(0)
  model = MlpModel(batch_size=BATCH, hidden_size=32)
  step = model.make_train_step(impl)
  images, labels = synthetic_digits(BATCH * STEPS, seed=0)
  losses = [float(step(images[i * BATCH:(i + 1) * BATCH], labels[i * BATCH:(i + 1) * BATCH]))
            for i in range(STEPS)]
  eval_images, eval_labels = synthetic_digits(BATCH, seed=1)
  return model, losses, float(model.make_eval_step(impl)(eval_images, eval_labels))


def main(cluster_arg, model_dir):
  single_losses = train(mtf.PlacementMeshImpl("", "", [""]))[1]
  try:
    cluster.connect(cluster_arg, "rows:2;cols:2")  # 4 processors on 8 devices
    mismatch = None
  except cluster.ClusterError as e:
    mismatch = str(e)
  devices = cluster.connect(cluster_arg, MESH)
  impl = mtf.PlacementMeshImpl(MESH, LAYOUT, devices)
  _, losses, eval_loss = train(impl)
  path = mtf.save_checkpoint(os.path.join(model_dir, "model.ckpt"), impl,
                             global_step=STEPS)
  print(json.dumps({"single_losses": single_losses, "losses": losses,
                    "eval_loss": eval_loss, "checkpoint": path, "devices": devices,
                    "mismatch_error": mismatch}))


if __name__ == "__main__":
  main(*sys.argv[1:])
