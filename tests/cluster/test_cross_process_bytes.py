"""Bytes per process that cross the process boundary: what the placement backend emits
equals the cost model's prediction, for meshes split over 2 and 4 processes."""
import pytest

import mesh_tf as mtf
from mesh_tf import analysis
from mesh_tf import cluster
from mesh_tf.analysis import communication
from tests import mtf_testing
from models.mlp import model as mlp
from models.tiny_lm import config as lm_config
from models.tiny_lm import mtf_model as lm

LAYOUTS = {
    "dp": ("all:8", "batch:all"),
    "mp": ("all:8", "hidden:all;d_ff:all;heads:all"),
    "dp+mp": ("rows:2;cols:4", "batch:rows;hidden:cols;d_ff:cols;heads:cols"),
    "mp+dp": ("rows:4;cols:2", "batch:cols;hidden:rows;d_ff:rows;heads:rows"),
}


def _mlp():
  model = mlp.MlpModel(batch_size=32, hidden_size=64)
  return model, mlp.synthetic_digits(32)


def _tiny_lm():
  model = lm.TinyLmModel(lm_config.TinyLmConfig(num_layers=1, heads=8))
  batch = lm_config.synthetic_batch(model.config)
  return model, (batch[:, :-1], batch[:, 1:])


def _emitted_records(model, impl, feeds):
  """The CollectiveRecords the backend logged while tracing one train step."""
  return mtf_testing.traced_train_step(model, impl, feeds)[1].comm_records


CASES = [(layout, _mlp) for layout in LAYOUTS] + [("dp+mp", _tiny_lm), ("mp+dp", _tiny_lm)]


@pytest.mark.parametrize("layout, build", CASES,
                         ids=["%s-%s" % (l, b.__name__[1:]) for l, b in CASES])
def test_crossing_bytes_emitted_equal_predicted(layout, build):
  mesh_shape, rules = LAYOUTS[layout]
  model, feeds = build()
  impl = mtf.PlacementMeshImpl(mesh_shape, rules, ["/cpu:%d" % i for i in range(8)])
  emitted = _emitted_records(model, impl, feeds)
  predicted = analysis.estimate_cost(model.graph, mesh_shape, rules,
                                     fetches=[model.loss] + model.update_ops)
  total = communication.total_bytes_per_processor(emitted) * 8
  for tasks in (2, 4):
    # The mesh as a client lays it over `tasks` workers of 8 / tasks devices each.
    processes = cluster.processes_of_devices(cluster.task_devices(tasks, 8 // tasks))
    crossing = communication.bytes_crossing_processes(emitted, mesh_shape, processes)
    want = communication.bytes_crossing_processes(predicted.comm_records, mesh_shape,
                                                  processes)
    assert sorted(crossing) == list(range(tasks))
    assert crossing == pytest.approx(want), tasks
    assert 0 < sum(crossing.values()) <= total + 1e-6
  # With one process per processor everything sent crosses; with one process, nothing.
  everyone_apart = communication.bytes_crossing_processes(emitted, mesh_shape, range(8))
  assert sum(everyone_apart.values()) == pytest.approx(total)
  alone = communication.bytes_crossing_processes(emitted, mesh_shape, [0] * 8)
  assert alone == {0: 0.0}


def test_mlp_data_parallel_over_two_processes_is_two_ring_hops():
  # all:8 over tasks {0-3},{4-7}: the ring crosses at 3->4 and 7->0, so each process
  # sends one processor's allreduce share of every gradient (and of the mean loss).
  model, feeds = _mlp()
  impl = mtf.PlacementMeshImpl("all:8", "batch:all", ["/cpu:%d" % i for i in range(8)])
  emitted = _emitted_records(model, impl, feeds)
  w1, w2, scalar = 28 * 28 * 64 * 4, 64 * 10 * 4, 4
  share = 2.0 * 7 / 8 * (w1 + w2 + scalar)
  got = communication.bytes_crossing_processes(emitted, "all:8", [0] * 4 + [1] * 4)
  assert got == pytest.approx({0: share, 1: share})


def test_model_split_kept_inside_a_process_crosses_only_for_the_batch():
  # rows:2;cols:4 over 2 tasks: each task holds one row, so the cols (model) groups
  # never leave a process and only the batch-dim (rows) allreduces cross.
  model, feeds = _mlp()
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols",
                               ["/cpu:%d" % i for i in range(8)])
  emitted = _emitted_records(model, impl, feeds)
  rows_only = [r for r in emitted if r.mesh_axes == (0,)]
  got = communication.bytes_crossing_processes(emitted, "rows:2;cols:4", [0] * 4 + [1] * 4)
  want = 4 * communication.total_bytes_per_processor(rows_only)
  assert got == pytest.approx({0: want, 1: want}) and want > 0
