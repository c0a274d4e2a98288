"""mtf.layers.pipeline: S stages x R repeats of dense+relu layers, pipelined over
microbatches, give the numbers (forward and every gradient) of the same layers applied one
after another in plain TF, on one device and on every backend with `stages` split; and the
bubble (stage slots that hold no microbatch) is (S-1)/(M+S-1) of the program's slots."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import check_layer
from mtf_testing import BATCH, HIDDEN, backend_mesh_impl, lower_and_export, new_mesh
from mtf_testing import random_array

D_FF = mtf.Dimension("d_ff", 8)
X = random_array([BATCH, HIDDEN], 7)


def _stages(s):
  return mtf.Dimension("stages", s)


def _stage_fn(stages_dim, calls=None):
  """One dense+relu layer per stage: relu(h wi + bi) wo + bo, weights per stage."""
  def fn(h, repeat):
    if calls is not None:
      calls.append((h, repeat))
    y = mtf.layers.dense(h, D_FF, reduced_dims=[HIDDEN], expert_dims=[stages_dim],
                         activation=mtf.relu, name="wi")
    return mtf.layers.dense(y, HIDDEN, reduced_dims=[D_FF], expert_dims=[stages_dim],
                            name="wo")
  return fn


def _build(s, m, r):
  stages_dim = _stages(s)
  return lambda x: mtf.layers.pipeline(_stage_fn(stages_dim), x, stages_dim,
                                       "microbatch", num_microbatches=m, num_repeats=r)


def _reference(s, r):
  """The S*R layers one after another: layer l = r*S + s uses stage s of repeat r."""
  def ref(xs, params):
    h = xs[0]
    for layer in range(s * r):
      rep, stage = divmod(layer, s)
      p = lambda n: params["pipeline/repeat_%d/%s" % (rep, n)][stage]
      h = tf.nn.relu(h @ p("wi/kernel") + p("wi/bias")) @ p("wo/kernel") + p("wo/bias")
    return h
  return ref


def _check(impl, s, m, r):
  _, params = check_layer(impl, [(X, [BATCH, HIDDEN])], _build(s, m, r), _reference(s, r))
  assert len(params) == 4 * r, sorted(params)


@pytest.mark.parametrize("s,m,r", [(2, 1, 1), (2, 2, 1), (2, 4, 1), (4, 1, 1),
                                   (4, 2, 1), (4, 4, 1), (2, 4, 2), (4, 2, 2)])
def test_matches_layers_one_after_another(s, m, r):
  _check(mtf.PlacementMeshImpl("", "", [""]), s, m, r)


STAGE_ONLY = ("stage:2", "stages:stage")
MESH_3D = ("stage:2;batch:2;model:2", "stages:stage;batch:batch;d_ff:model")


@pytest.mark.parametrize("backend", ["placement", "simd", "gspmd"])
@pytest.mark.parametrize("mesh,s,m,r", [
    (STAGE_ONLY, 2, 4, 2),   # circular: the last stage feeds stage 0 across processors
    (MESH_3D, 4, 2, 1),      # two stages per processor, batch and model split too
    (MESH_3D, 2, 4, 2),
], ids=["stage2-S2-M4-R2", "3d-S4-M2", "3d-S2-M4-R2"])
def test_on_backends(backend, mesh, s, m, r):
  _check(backend_mesh_impl(backend, *mesh), s, m, r)


@pytest.mark.parametrize("s,m", [(2, 1), (2, 4), (4, 2), (4, 4)])
def test_bubble(s, m):
  """A stage slot is padding iff the output does not depend on it: the gradient of the
  outputs w.r.t. the buffer that stage_fn reads is zero there, in the lowered program."""
  graph, mesh = new_mesh()
  stages_dim, calls = _stages(s), []
  x = mtf.import_tf_tensor(mesh, X, [BATCH, HIDDEN])
  y = mtf.layers.pipeline(_stage_fn(stages_dim, calls), x, stages_dim, "microbatch",
                          num_microbatches=m)
  assert len(calls) == m + s - 1 == len(mtf.layers.pipeline_schedule(s, m))
  grads = mtf.gradients([y], [h for h, _ in calls])
  values = lower_and_export(graph, mesh, mtf.PlacementMeshImpl("", "", [""]), grads)
  real = np.array([[np.any(g[stage] != 0) for stage in range(s)] for g in values])
  schedule = mtf.layers.pipeline_schedule(s, m)
  assert real.tolist() == [[stage in it.slots for stage in range(s)] for it in schedule]
  padding = real.size - real.sum()
  assert padding * (m + s - 1) == real.size * (s - 1), (padding, real.size)


def test_circular_schedule_counts():
  """Circular: M*R + S - 1 iterations when S divides M; slot bubble (S-1)/(M*R+S-1)."""
  for s, m, r in [(2, 2, 2), (2, 4, 2), (4, 4, 2), (4, 8, 3)]:
    schedule = mtf.layers.pipeline_schedule(s, m, r)
    assert len(schedule) == m * r + s - 1
    busy = sum(len(it.slots) for it in schedule)
    assert busy == m * r * s
    assert (len(schedule) * s - busy) * (m * r + s - 1) == len(schedule) * s * (s - 1)
    # every microbatch runs layers 0 .. S*R-1 in order, one per iteration
    seen = {}
    for it in schedule:
      for stage, (j, rep) in it.slots.items():
        seen.setdefault(j, []).append(rep * s + stage)
    assert all(seen[j] == list(range(s * r)) for j in range(m))
  # Where stages run different repeats, stage_fn runs once per repeat on the whole
  # buffer: S=2, M=4, R=2 takes 9 iterations but 12 stage_fn applications.
  _, mesh = new_mesh()
  stages_dim, calls = _stages(2), []
  mtf.layers.pipeline(_stage_fn(stages_dim, calls), mtf.import_tf_tensor(
      mesh, X, [BATCH, HIDDEN]), stages_dim, "microbatch", num_microbatches=4,
                      num_repeats=2)
  assert [rep for _, rep in calls] == [0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1]


def test_errors():
  graph, mesh = new_mesh()
  del graph
  stages_dim = _stages(2)
  x = mtf.import_tf_tensor(mesh, X, [BATCH, HIDDEN])
  with pytest.raises(mtf.ShapeError, match="does not divide into 3 microbatches") as e:
    mtf.layers.pipeline(_stage_fn(stages_dim), x, stages_dim, "mb", num_microbatches=3)
  assert e.value.dim == "batch"
  with pytest.raises(mtf.ShapeError, match="lacks dim stages:2") as e:
    mtf.layers.pipeline(lambda h, r: mtf.reduce_sum(h, reduced_dim=stages_dim), x,
                        stages_dim, "mb", num_microbatches=2)
  assert e.value.dim == "stages"
  with pytest.raises(mtf.ShapeError, match="already a dim of input"):
    mtf.layers.pipeline(_stage_fn(stages_dim), x, mtf.Dimension("hidden", 2), "mb",
                        num_microbatches=2)


def test_shift_of_split_stages_is_a_neighbour_exchange():
  """With `stages` split, the buffer's shift receives one neighbour's slice (no gather),
  on the placement and SIMD backends' plans; the microbatch cut is local."""
  graph, mesh = new_mesh()
  stages_dim = _stages(4)
  x = mtf.import_tf_tensor(mesh, X, [BATCH, HIDDEN])
  mtf.layers.pipeline(_stage_fn(stages_dim), x, stages_dim, "microbatch",
                      num_microbatches=2, num_repeats=2)
  shifts = [op for op in graph.operations if isinstance(op, mtf.ShiftOperation)]
  assert len(shifts) == len(mtf.layers.pipeline_schedule(4, 2, 2)) - 1
  for backend in ["placement", "simd"]:
    layout = backend_mesh_impl(backend, *MESH_3D).slice_layout
    for op in shifts:
      steps = [type(step).__name__ for o in op.plan(layout).operands for step in o.steps]
      assert steps == ["Receive"], (backend, op.name, steps)
  # Cutting the batch into microbatches (entries j, j+M, ...) and back moves no data.
  layout = backend_mesh_impl("placement", *MESH_3D).slice_layout
  cuts = [op for op in graph.operations if isinstance(op, mtf.ReshapeOperation)
          and "microbatch" in op.inputs[0].shape.dimension_names
          + op.outputs[0].shape.dimension_names]
  assert len(cuts) == 2
  assert all(not o.steps for op in cuts for o in op.plan(layout).operands)


# ----------------------------------------------- GSPMD, partitioned by XLA (via jaxlib)
PARTITION_SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "backends",
                                "gspmd", "partition_with_jax.py")


def _export_for_xla(case_dir, s, m, r):
  """Writes the jit-compiled forward+backward step's HLO and inputs to case_dir (as
  partition_with_jax.py reads them); returns TF's unpartitioned outputs."""
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, tf.TensorSpec(X.shape), [BATCH, HIDDEN])
  y = _build(s, m, r)(x)
  loss = mtf.reduce_sum(mtf.square(y))
  outs = [y] + mtf.gradients(
      [loss], [x] + [v.outputs[0] for v in graph.trainable_variables])
  impl = mtf.GSPMDMeshImpl(*MESH_3D)
  mtf.Lowering(graph, {mesh: impl})  # creates the variables

  @tf.function(jit_compile=True, autograph=False)
  def step(value):
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds={x: value})
    return [lowering.export_to_tf_tensor(t) for t in outs]

  arg = tf.constant(X)
  with open(os.path.join(case_dir, "module.pb"), "wb") as f:
    f.write(step.experimental_get_compiler_ir(arg)(stage="hlo_serialized"))
  # HLO parameters: the argument, then the captures (variables, constants).
  by_handle = {id(v.variable.handle): v for v in impl.variable_store.values()}
  params = [X]
  for c in step.get_concrete_function(arg).captured_inputs:
    v = by_handle.get(id(c))
    params.append(v.variable.numpy() if v is not None else c.numpy())
  np.savez(os.path.join(case_dir, "inputs.npz"),
           **{"arg_%d" % i: np.asarray(p) for i, p in enumerate(params)})
  lowering = mtf.Lowering(graph, {mesh: impl}, feeds={x: arg})
  return [lowering.export_to_tf_tensor(t).numpy() for t in outs]


XLA_CASES = {"circular-S2-M4-R2": (2, 4, 2), "plain-S4-M2": (4, 2, 1)}


@pytest.fixture(scope="module")
def xla_partitioned(tmp_path_factory):
  """{case: (TF's outputs, XLA-partitioned outputs, collective kinds)}, every case run by
  one jaxlib subprocess on 8 CPU devices."""
  if sys.version_info < (3, 11):
    pytest.skip("jax/jaxlib 0.10.2 need Python >= 3.11; XLA partitioner check skipped")
  dirs, want = {}, {}
  for name, (s, m, r) in XLA_CASES.items():
    dirs[name] = str(tmp_path_factory.mktemp(name))
    want[name] = _export_for_xla(dirs[name], s, m, r)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("MESH_TF_TEST_HIDDEN_MODULES", None)  # this subprocess needs jax (conftest.py)
  proc = subprocess.run([sys.executable, PARTITION_SCRIPT, "8"] + list(dirs.values()),
                        capture_output=True, text=True, timeout=300, env=env, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = {}
  for name, case_dir in dirs.items():
    with np.load(os.path.join(case_dir, "outputs.npz")) as outs:
      got = [outs["out_%d" % i] for i in range(len(outs.files))]
    with open(os.path.join(case_dir, "report.json")) as f:
      kinds = [c["kind"] for c in json.load(f)["collectives"]]
    results[name] = (want[name], got, kinds)
  return results


@pytest.mark.jax
@pytest.mark.parametrize("case", sorted(XLA_CASES))
def test_gspmd_partitioned_by_xla(xla_partitioned, case):
  """The jit-compiled forward+backward pipeline, partitioned by XLA's SPMD partitioner on
  the 8 CPU devices of the 3-D mesh, gives TF's unpartitioned numbers."""
  want, got, _ = xla_partitioned[case]
  assert len(got) == len(want) == 2 + 4 * XLA_CASES[case][2]  # y, dx, 4 per repeat
  for i, (a, b) in enumerate(zip(got, want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg="%s output %d" % (
        case, i))


@pytest.mark.jax
def test_gspmd_plain_shift_is_a_collective_permute(xla_partitioned):
  """Without wrap, XLA moves the buffer between stage processors with collective-permutes
  (a neighbour exchange), never by regathering the stages dim."""
  kinds = xla_partitioned["plain-S4-M2"][2]
  assert "collective-permute" in kinds, sorted(set(kinds))
  assert "all-to-all" not in kinds and "all-gather" not in kinds, sorted(set(kinds))


@pytest.mark.jax
def test_gspmd_circular_shift_is_a_collective_permute(xla_partitioned):
  """The circular schedule's wrapping shift is a neighbour exchange too (a wrapping
  shift is lowered as two no-wrap shifts, not tf.roll, which XLA reshards)."""
  kinds = xla_partitioned["circular-S2-M4-R2"][2]
  assert "collective-permute" in kinds and "all-to-all" not in kinds, sorted(set(kinds))
