"""The README example: 2-layer MLP on mesh [2,4], batch on rows and hidden on cols."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.mlp.model import MlpModel, synthetic_digits

DEVICES = ["/cpu:%d" % i for i in range(8)]
BATCH = 32


def _batches(n, seed=0):
  images, labels = synthetic_digits(BATCH * n, seed=seed)
  return [(images[i * BATCH:(i + 1) * BATCH], labels[i * BATCH:(i + 1) * BATCH])
          for i in range(n)]


def test_trains_under_tf_function_and_restores_on_one_device(tmp_path):
  model = MlpModel(batch_size=BATCH, hidden_size=32)
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols", DEVICES)
  train_step = model.make_train_step(impl)
  eval_step = model.make_eval_step(impl)
  eval_batch = _batches(1, seed=1)[0]
  before = float(eval_step(*eval_batch))
  num_ops = len(model.graph.operations)
  variables = dict(impl.variable_store)
  losses = [float(train_step(*b)) for b in _batches(25)]
  after = float(eval_step(*eval_batch))
  assert after < 0.25 * before, (before, after)
  assert losses[-1] < losses[0]
  # One trace, no new mtf ops, no new variables across 25 calls.
  assert train_step.experimental_get_tracing_count() == 1
  assert len(model.graph.operations) == num_ops
  assert impl.variable_store == variables
  # The slices really are split: w1 [rows, cols, hidden] has hidden on mesh dim cols.
  w1_slices = impl.variable_store["w1"].slice_variables
  assert w1_slices[0].shape.as_list() == [28, 28, 8]

  path = mtf.save_checkpoint(str(tmp_path / "model.ckpt"), impl, global_step=25)
  names = dict(tf.train.list_variables(path))
  assert names["w1"] == [28, 28, 32] and names["w2"] == [32, 10]

  single = mtf.PlacementMeshImpl("", "", [""])
  single_eval = model.make_eval_step(single)
  assert abs(float(single_eval(*eval_batch)) - after) > 1e-3  # fresh init differs...
  mtf.restore_checkpoint(path, single)
  np.testing.assert_allclose(float(single_eval(*eval_batch)), after, rtol=1e-5)  # ...until restored


def test_model_function_inside_tf_function_builds_graph_once():
  """The original's style: build the mtf graph in a model function called while tracing."""
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols", DEVICES)
  builds = []

  @tf.function
  def train_step(images, labels):
    model = MlpModel(batch_size=BATCH, hidden_size=16)
    builds.append(model)
    lowering = mtf.Lowering(model.graph, {model.mesh: impl},
                            feeds={model.images: images, model.labels: labels})
    for op in model.update_ops:
      lowering.lowered_operation(op)
    return lowering.export_to_tf_tensor(model.loss)

  batches = _batches(6)
  losses = [float(train_step(*batches[0]))]
  # TF traces a second time when the first trace created variables; never after that.
  builds_after_first_call = len(builds)
  assert 1 <= builds_after_first_call <= 2
  losses += [float(train_step(*b)) for b in batches[1:]]
  assert len(builds) == builds_after_first_call
  assert sorted(impl.variable_store) == ["w1", "w2"]
  assert losses[-1] < losses[0]


def test_jit_compiled_step_matches_on_one_device():
  batches = _batches(3)
  results = []
  for jit in (False, True):
    model = MlpModel(batch_size=BATCH, hidden_size=16)
    impl = mtf.PlacementMeshImpl("", "", [""])
    step = model.make_train_step(impl, jit_compile=jit)
    results.append([float(step(*b)) for b in batches])
  np.testing.assert_allclose(results[0], results[1], rtol=1e-5)


def test_trainer_layout_report_mode_prints_splits_warnings_and_cost():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  out = subprocess.run(
      [sys.executable, "-m", "models.mlp.main", "--mode=layout_report",
       "--mesh_shape=rows:2;cols:4", "--layout=batch:rows;classes:cols"],
      capture_output=True, text=True, timeout=300, check=True).stdout
  assert "batch over rows (rule batch:rows)" in out
  assert "classes:cols cannot apply, 4 does not divide classes=10" in out
  good = subprocess.run(
      [sys.executable, "-m", "models.mlp.main", "--mode=layout_report",
       "--mesh_shape=rows:2;cols:4", "--layout=batch:rows"],
      capture_output=True, text=True, timeout=300, check=True).stdout
  assert "computed identically on every processor of mesh dims ['cols']" in good
  assert "bytes sent" in good and "allreduce" in good


def test_virtual_cpu_count_mismatch_is_a_clear_error():
  # conftest made 8 devices before TF initialized; asking for another count now fails.
  with pytest.raises(mtf.LayoutError, match="already runs with 8"):
    mtf.utils.configure_virtual_cpus(4)
  assert mtf.utils.configure_virtual_cpus(8) == ["/cpu:%d" % i for i in range(8)]
