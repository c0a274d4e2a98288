"""Run by test_spmd_replica.py in a fresh process with TF's BFC CPU allocator: prints the
bytes in use after replica 1 of mesh model:8 makes its slice of a [1024, 256] float32
variable (split over model on its first dim), and again after assign_full."""
import json
import os

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import mesh_tf as mtf  # pylint: disable=g-import-not-at-top,wrong-import-position
from mesh_tf.backends.simd_multi_client import MultiClientMeshImpl  # pylint: disable=g-import-not-at-top,wrong-import-position


def in_use():
  return tf.config.experimental.get_memory_info("CPU:0")["current"]


def main():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  rows, cols = mtf.Dimension("d_ff", 1024), mtf.Dimension("d_model", 256)
  v = mtf.get_variable(mesh, "w", [rows, cols]).operation
  impl = MultiClientMeshImpl("model:8", "d_ff:model", pnum=1, device="/cpu:0")
  base = in_use()
  laid_out = impl.make_variable(v)
  made = in_use() - base
  laid_out.assign_full(tf.ones([1024, 256]))
  assigned = in_use() - base
  print(json.dumps({"made": made, "assigned": assigned,
                    "slice": laid_out.variable.shape.num_elements() * 4}))


if __name__ == "__main__":
  main()
