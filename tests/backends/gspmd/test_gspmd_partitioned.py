"""The GSPMD step, partitioned by XLA on 8 host CPU devices, computes what TF computes.

TensorFlow will not partition on CPU, so each case's jit-compiled step is exported as
serialized HLO and handed to XLA's SPMD partitioner through jaxlib in a subprocess
(partition_with_jax.py; one process runs every case). The tests check, for dp, mp and
dp+mp layouts of the MLP and the Transformer layer on a 2x4 mesh:
- the partitioned outputs (loss, gradients, updated variables) equal TF's unpartitioned
  single-device result;
- each device received, for every input and variable, the shard that the layout gives
  it (shape as PlacementMeshImpl's slice_shape, position as the processor coordinates);
- the collectives XLA inserted: only all-reduces, moving exactly the bytes that the
  placement and SIMD backends' accounting records (XLA merges some, so fewer of them).
"""
import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import mesh_tf as mtf

import gspmd_hlo
import gspmd_models

# jax/jaxlib come with the test extra; only the subprocess imports them (TF and jax each
# bundle XLA), so this process just checks they are installed. setup.py installs them on
# Python >= 3.11 only (no 0.10.2 wheels below): there the module skips, with this reason;
# from 3.11 on a missing jax is an install error, never a skip.
pytestmark = pytest.mark.jax
if sys.version_info < (3, 11):
  pytest.skip("jax/jaxlib 0.10.2 need Python >= 3.11; XLA SPMD partitioner check skipped",
              allow_module_level=True)
assert importlib.util.find_spec("jax") and importlib.util.find_spec("jaxlib"), (
    "pip install -e .[test] (jax/jaxlib run XLA's SPMD partitioner in these tests)")

DEVICES = ["/cpu:%d" % i for i in range(8)]
SCRIPT = os.path.join(os.path.dirname(__file__), "partition_with_jax.py")
CASES = [(model, layout) for model, (_, layouts) in gspmd_models.BUILDERS.items()
         for layout in layouts]
MESH_AXIS = {"rows": 0, "cols": 1}


class ExportedCase:
  """One case's exported step, its TF results, and (after the run) jax's results."""

  def __init__(self, model_name, layout_name, case_dir):
    build, layouts = gspmd_models.BUILDERS[model_name]
    self.layout = layouts[layout_name]
    self.model = build()
    self.impl = mtf.GSPMDMeshImpl(gspmd_models.MESH_SHAPE, self.layout)
    self.case_dir = case_dir
    step = gspmd_models.make_step(self.model, self.impl, jit_compile=True)
    args = self.model.input_values()
    self.hlo_text = step.experimental_get_compiler_ir(*args)(stage="hlo")
    with open(os.path.join(case_dir, "module.pb"), "wb") as f:
      f.write(step.experimental_get_compiler_ir(*args)(stage="hlo_serialized"))
    # HLO parameters: the function's arguments, then its captures (variables, constants).
    params = list(args)
    self.param_shapes = [p.shape for p, _ in self.model.inputs]
    by_handle = {id(v.variable.handle): v for v in self.impl.variable_store.values()}
    self.param_variables = [None] * len(args)
    for c in step.get_concrete_function(*args).captured_inputs:
      v = by_handle.get(id(c))
      self.param_variables.append(v)
      self.param_shapes.append(v.shape if v is not None else mtf.Shape([]))
      params.append(v.variable.numpy() if v is not None else c.numpy())
    np.savez(os.path.join(case_dir, "inputs.npz"),
             **{"arg_%d" % i: np.asarray(p) for i, p in enumerate(params)})
    # TF's own unpartitioned, single-device run of the same global program (eagerly:
    # an XLA compile here would only cost time).
    self.tf_fetches = [o.numpy() for o in gspmd_models.eager_step(self.model, self.impl)]
    self.tf_variables = {name: v.read_full().numpy()
                         for name, v in self.impl.variable_store.items()}
    self.outputs = self.report = None

  def load_results(self):
    with np.load(os.path.join(self.case_dir, "outputs.npz")) as outs:
      self.outputs = [outs["out_%d" % i] for i in range(len(outs.files))]
    with open(os.path.join(self.case_dir, "report.json")) as f:
      self.report = json.load(f)

  def expected_outputs(self):
    """TF's value for each HLO output: fetches, then variables as input_output_alias says."""
    aliases = {int(o): int(p) for o, p in re.findall(r"\{(\d+)\}: \((\d+), \{\}",
                                                     self.hlo_text.split("\n")[0])}
    want = list(self.tf_fetches)
    for i in range(len(self.tf_fetches), len(self.outputs)):
      want.append(self.tf_variables[self.param_variables[aliases[i]].name])
    return want


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory):
  """Every case exported, partitioned and run by jaxlib in one subprocess."""
  cases = {}
  for model_name, layout_name in CASES:
    case_dir = str(tmp_path_factory.mktemp("%s_%s" % (model_name, layout_name)))
    cases[(model_name, layout_name)] = ExportedCase(model_name, layout_name, case_dir)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("MESH_TF_TEST_HIDDEN_MODULES", None)  # this subprocess needs jax (conftest.py)
  proc = subprocess.run([sys.executable, SCRIPT, "8"] + [c.case_dir for c in cases.values()],
                        capture_output=True, text=True, timeout=600, env=env, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  for c in cases.values():
    c.load_results()
  return cases


@pytest.mark.parametrize("model_name,layout_name", CASES)
def test_partitioned_run_matches_single_device(partitioned, model_name, layout_name):
  case = partitioned[(model_name, layout_name)]
  want = case.expected_outputs()
  assert len(case.outputs) == len(case.tf_fetches) + len(case.model.variables)
  for i, (got, ref) in enumerate(zip(case.outputs, want)):
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6,
                               err_msg="%s %s: output %d" % (model_name, layout_name, i))


@pytest.mark.parametrize("model_name,layout_name", CASES)
def test_each_device_received_its_shard(partitioned, model_name, layout_name):
  case = partitioned[(model_name, layout_name)]
  placement = mtf.PlacementMeshImpl(gspmd_models.MESH_SHAPE, case.layout, DEVICES)
  rules = {p.split(":")[0]: MESH_AXIS[p.split(":")[1]] for p in case.layout.split(";")}
  params = case.report["parameters"]
  assert len(params) == len(case.param_shapes)
  split_somewhere = False
  for i, (shape, param) in enumerate(zip(case.param_shapes, params)):
    want = placement.slice_shape(shape)
    assert param["shard_shapes"] == [want] * 8, "parameter %d %s" % (i, shape)
    assert case.report["entry_parameter_shapes"][i] == want, "parameter %d" % i
    got = gspmd_hlo.device_blocks(param["sharding"].strip("{}"), shape.ndims, 8)
    assert got == gspmd_hlo.expected_blocks(shape.dimension_names, rules, [2, 4]), (
        "parameter %d %s: sharding %s" % (i, shape, param["sharding"]))
    split_somewhere |= want != shape.to_integer_list
  assert split_somewhere
  # The updated variables come back in their own layout, not gathered.
  for i, out in enumerate(case.report["outputs"][len(case.tf_fetches):]):
    var = case.model.variables[i]
    assert out["shard_shapes"] == [placement.slice_shape(var.shape)] * 8, var.name


@pytest.mark.parametrize("model_name,layout_name", CASES)
def test_collectives_xla_inserted(partitioned, model_name, layout_name):
  case = partitioned[(model_name, layout_name)]
  xla = case.report["collectives"]
  # The placement and SIMD backends' accounting of the same step (they agree).
  placement = mtf.PlacementMeshImpl(gspmd_models.MESH_SHAPE, case.layout, DEVICES)
  gspmd_models.run_step(gspmd_models.BUILDERS[model_name][0](), placement, eager=True)
  simd = mtf.SimdMeshImpl(gspmd_models.MESH_SHAPE, case.layout)
  gspmd_models.run_step(gspmd_models.BUILDERS[model_name][0](), simd, eager=True)
  assert [(r.kind, r.slice_bytes) for r in simd.comm_log] == [
      (r.kind, r.slice_bytes) for r in placement.comm_log]
  mtf_kinds = {r.kind for r in placement.comm_log}
  xla_kinds = {c["kind"] for c in xla}
  print("%s %s: XLA %s; placement %s" % (
      model_name, layout_name, _summary([(c["kind"], c["bytes"]) for c in xla]),
      _summary([(r.kind, r.slice_bytes) for r in placement.comm_log])))
  # Both backends only sum partial results (where a contracted dim is split), and they
  # move the same bytes: XLA merges several all-reduces into one, so it has fewer.
  assert mtf_kinds == {"allreduce"} and xla_kinds == {"all-reduce"}
  assert sum(c["bytes"] for c in xla) == sum(r.slice_bytes for r in placement.comm_log)
  assert len(xla) <= len(placement.comm_log)
  # The partitioned program's text is where these come from.
  text = open(os.path.join(case.case_dir, "partitioned.txt")).read()
  assert len(gspmd_hlo.collectives(text)) == len(xla) > 0


def _summary(pairs):
  counts = {}
  for kind, size in pairs:
    n, total = counts.get(kind, (0, 0))
    counts[kind] = (n + 1, total + size)
  return ", ".join("%d %s (%d bytes)" % (n, k, b) for k, (n, b) in sorted(counts.items()))
