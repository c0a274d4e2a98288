"""The SIMD program does not grow with the mesh: a 2-layer MLP train step traced at 8, 64
and 512 emulated cores has exactly the same number of TF ops."""
import collections

import tensorflow as tf

import mesh_tf as mtf
from models.mlp.model import MlpModel

MESHES = ["rows:2;cols:4", "rows:8;cols:8", "rows:16;cols:32"]
LAYOUT = "batch:rows;hidden:cols"


def _train_step_graph(mesh_shape):
  model = MlpModel(batch_size=32, rows=4, cols=4, hidden_size=64, num_classes=10)
  impl = mtf.SimdMeshImpl(mesh_shape, LAYOUT)
  step = model.make_train_step(impl)
  concrete = step.get_concrete_function(tf.TensorSpec([32, 4, 4], tf.float32),
                                        tf.TensorSpec([32], tf.int32))
  return concrete.graph, impl


def test_train_step_op_count_is_independent_of_core_count():
  counts, kinds = {}, {}
  for mesh_shape in MESHES:
    graph, impl = _train_step_graph(mesh_shape)
    counts[impl.size] = len(graph.get_operations())
    kinds[impl.size] = collections.Counter(op.type for op in graph.get_operations())
    assert {r.kind for r in impl.comm_log} >= {"allreduce"}, mesh_shape
  assert sorted(counts) == [8, 64, 512]
  assert counts[8] == counts[64] == counts[512], counts
  assert kinds[8] == kinds[512]
  # the program is per-core sized: no per-core loops or unrolled copies
  assert not {"While", "StatelessWhile"} & set(kinds[512])
