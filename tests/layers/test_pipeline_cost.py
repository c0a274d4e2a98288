"""The cost of mtf.layers.pipeline, measured against the analysis.

- The bytes a pipelined train step moves, as the placement backend records its
  collectives, are estimate_cost's prediction, and between stages they are the
  closed form: one buffer slice received per shift (a neighbour exchange) and one
  allreduce over the stage mesh dim per microbatch leaving (forward) or entering
  (its gradient).
- auto_mtf knows a pipeline's stages dim: it splits it only over a mesh dim of its
  size, and the step-time search keeps it split where the mesh has such a dim.
- predict_memory holds 1/S of the stage weights per device when `stages` is split.
- benchmarks/pipeline.py's tiny run prints every row, bytes recorded == predicted (run
  in this process, M = 2 only: each variant's traced placement program takes seconds).
"""
import collections

import pytest

from benchmarks import pipeline as pipeline_benchmark
import mesh_tf as mtf
from mesh_tf import analysis
from mesh_tf.auto_mtf import valid_layouts
from mesh_tf.lowering.train_step import lower_train_step
from mtf_testing import BATCH, HIDDEN, backend_mesh_impl, new_mesh, random_array

D_FF = mtf.Dimension("d_ff", 8)
X = random_array([BATCH, HIDDEN], 3)


def _train_graph(s, m, r=1):
  """A pipelined train step: S*R dense+relu layers, loss sum(y^2), SGD; the fetches
  are the loss, dL/dx and the updates."""
  graph, mesh = new_mesh()
  stages = mtf.Dimension("stages", s)

  def stage_fn(h, repeat):
    del repeat
    y = mtf.layers.dense(h, D_FF, reduced_dims=[HIDDEN], expert_dims=[stages],
                         activation=mtf.relu, name="wi")
    return mtf.layers.dense(y, HIDDEN, reduced_dims=[D_FF], expert_dims=[stages],
                            name="wo")
  x = mtf.import_tf_tensor(mesh, X, [BATCH, HIDDEN])
  y = mtf.layers.pipeline(stage_fn, x, stages, "microbatch", num_microbatches=m,
                          num_repeats=r)
  loss = mtf.reduce_sum(mtf.square(y))
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [x] + [v.outputs[0] for v in variables])
  updates = mtf.optimize.SgdOptimizer(0.1).apply_grads(grads[1:], variables)
  return graph, mesh, loss, grads[0], updates


def _key(r):
  return (r.op, r.kind, r.mesh_axes, r.group_size, r.slice_bytes)


STAGE_ONLY = "stage-only"
MESH_3D = ("stage:2;batch:2;model:2", "stages:stage;batch:batch;d_ff:model")


@pytest.mark.parametrize("mesh", [STAGE_ONLY, "3d"])
@pytest.mark.parametrize("s,m,r", [(2, 2, 1), (2, 4, 1), (4, 2, 1), (4, 4, 1),
                                   (2, 4, 2)])
def test_bytes_between_stages_equal_the_prediction(mesh, s, m, r):
  if mesh == STAGE_ONLY:
    mesh_shape, rules = "stage:%d" % s, "stages:stage"
  else:
    mesh_shape, rules = MESH_3D
  graph, mtf_mesh, loss, dx, updates = _train_graph(s, m, r)
  impl = backend_mesh_impl("placement", mesh_shape, rules)
  lowering = mtf.Lowering(graph, {mtf_mesh: impl})  # eager: runs as it records
  lower_train_step(lowering, loss, updates)
  lowering.export_to_tf_tensor(dx)
  predicted = analysis.estimate_cost(graph, mesh_shape, rules,
                                     fetches=[loss, dx] + updates)
  recorded = lowering.comm_records
  assert (collections.Counter(map(_key, recorded)) ==
          collections.Counter(map(_key, predicted.comm_records)))

  # Between stages: the stage mesh dim is axis 0 of both meshes.
  stage_n = impl.shape[0].size
  batch_n = 2 if mesh != STAGE_ONLY else 1
  microbatch_bytes = BATCH.size // m // batch_n * HIDDEN.size * 4
  buffer_bytes = s // stage_n * microbatch_bytes  # the in-flight buffer's slice
  iterations = len(mtf.layers.pipeline_schedule(s, m, r))
  on_stage = [r_ for r_ in recorded if 0 in r_.mesh_axes]
  kinds = collections.Counter((r_.kind, r_.slice_bytes) for r_ in on_stage)
  # every shift (forward and its gradient) receives one neighbour's slice ...
  assert kinds.pop(("receive", buffer_bytes)) == 2 * (iterations - 1)
  # ... and each microbatch leaving the last stage (forward) and entering stage 0
  # (its gradient) is one allreduce of a microbatch slice over the stage mesh dim.
  assert kinds.pop(("allreduce", microbatch_bytes)) == 2 * m
  assert not kinds, kinds
  stage_bytes = analysis.total_bytes_per_processor(on_stage)
  assert stage_bytes == pytest.approx(
      2 * (iterations - 1) * buffer_bytes
      + 2 * m * 2.0 * (stage_n - 1) / stage_n * microbatch_bytes)
  assert stage_bytes == pytest.approx(analysis.total_bytes_per_processor(
      [r_ for r_ in predicted.comm_records if 0 in r_.mesh_axes]))
  if mesh == STAGE_ONLY:  # one stage per processor: exactly one microbatch per shift
    assert buffer_bytes == microbatch_bytes


def test_auto_layout_keeps_stages_on_a_mesh_dim_of_their_size():
  graph, _, loss, dx, updates = _train_graph(4, 2)
  fetches = [loss, dx] + updates
  v = valid_layouts.LayoutValidator(graph, "a:2;b:4")
  assert v.pipeline_stage_dims == {"stages": 4}
  assert v.is_valid_assignment("stages", "b") and not v.is_valid_assignment("stages", "a")
  assert v.is_valid_assignment("batch", "a")  # other dims as before
  # The original's memory objective: never two stages per processor.
  rules = mtf.auto_mtf.layout(graph, "a:2;b:4", fetches)
  assert rules.tensor_dimension_to_mesh_axis(
      mtf.Dimension("stages", 4), mtf.convert_to_shape("a:2;b:4")) in (1, None)
  # The step-time search: every candidate on a mesh with a dim of size 4 splits stages
  # over it; on the others stages stay whole.
  shape, rules, report = mtf.auto_mtf.choose_layout(graph, fetches, 8, max_mesh_dims=2)
  for c in report.candidates:
    sizes = dict(d.split(":") for d in c.mesh_shape.split(";"))
    placed = dict(r_.split(":") for r_ in c.layout_rules.split(";") if r_)
    if "4" in sizes.values():
      assert sizes[placed["stages"]] == "4", c
    else:
      assert "stages" not in placed, c
  del shape, rules  # (on 8 devices data parallelism may win: mesh_0:8 has no dim of 4)
  shape, rules, _ = mtf.auto_mtf.choose_layout(graph, fetches, "stage:4;model:2")
  assert dict(rules)["stages"] == "stage"
  # A shift along a dim no weight carries (e.g. a sequence) is not a pipeline.
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, X, [BATCH, HIDDEN])
  w = mtf.get_variable(mesh, "w", [HIDDEN, D_FF])
  mtf.einsum([mtf.shift(x, 1, "batch", wrap=False), w], reduced_dims=[HIDDEN])
  assert valid_layouts.pipeline_stage_dims(graph) == {}


@pytest.mark.parametrize("s", [2, 4])
def test_predicted_memory_holds_one_stage_of_weights(s):
  graph, _, loss, dx, updates = _train_graph(s, 2)
  fetches = [loss, dx] + updates
  whole = analysis.predict_memory(graph, "", "", fetches)
  split = analysis.predict_memory(graph, "stage:%d" % s, "stages:stage", fetches)
  assert whole.weight_bytes == s * 2 * (8 * 8 + 8) * 4  # every weight carries stages
  assert split.weight_bytes * s == whole.weight_bytes
  cost = analysis.estimate_cost(graph, "stage:%d" % s, "stages:stage", fetches)
  assert cost.variable_bytes_per_processor == split.weight_bytes
  # and each processor's slice variables hold that many bytes
  impl = backend_mesh_impl("placement", "stage:%d" % s, "stages:stage")
  mtf.Lowering(graph, {graph.operations[0].mesh: impl})
  per_device = sum(lv.slice_variables[0].shape.num_elements() * 4
                   for lv in impl.variable_store.values())
  assert per_device == split.weight_bytes


def test_benchmark_prints_every_row_with_recorded_bytes_equal_predicted(capsys):
  pipeline_benchmark.run("tiny", stages=(2, 4), microbatches=(2,), steps=1, repeats=1,
                         tf_function=False)
  lines = capsys.readouterr().out.splitlines()
  header = next(line for line in lines if line.startswith("variant"))
  rows = [line.split() for line in lines if line.startswith(("mp ", "pipe "))]
  labels = [" ".join(r[:3]) if r[0] == "pipe" else r[0] for r in rows]
  assert labels == ["mp", "pipe S=2 M=2", "pipe S=4 M=2"], lines
  assert "bubble" in header
  for r in rows:
    values = r[3:] if r[0] == "pipe" else r[1:]
    # ms, ratio, sent rec, sent pred, stage rec, stage pred, flops, bubble, extra, ...
    assert values[2] == values[3] and values[4] == values[5], r
    # same weights and data: the same first loss (up to the order of float sums)
    assert float(values[-1]) == pytest.approx(float(rows[0][-1]), abs=1e-4), r
    if r[0] == "pipe":
      s, m = int(r[1][2:]), int(r[2][2:])
      assert float(values[7]) == pytest.approx((s - 1) / (m + s - 1), abs=1e-3)
      assert int(values[4]) > 0
