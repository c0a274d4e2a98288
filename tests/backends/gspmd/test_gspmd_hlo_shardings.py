"""The HLO of a GSPMD step carries each tensor's layout as an XLA sharding.

For dp, mp and dp+mp layouts of an MLP and a Transformer layer on a 2x4 mesh, the
jit-compiled training step's HLO (experimental_get_compiler_ir) is parsed: every input,
variable read, variable write and einsum output (forward and backward) has a Sharding
whose per-device blocks are what the layout rules say, and every HLO parameter reaches a
Sharding annotation.
"""
import pytest

import mesh_tf as mtf
from mesh_tf.backends.gspmd_sharding import scope_name

import gspmd_hlo
import gspmd_models

MESH_SIZES = [2, 4]
MESH_AXIS = {"rows": 0, "cols": 1}
CASES = [(model, layout) for model, (_, layouts) in gspmd_models.BUILDERS.items()
         for layout in layouts]


def _rules(layout):
  return {pair.split(":")[0]: MESH_AXIS[pair.split(":")[1]] for pair in layout.split(";")}


def _step_hlo(model, impl):
  step = gspmd_models.make_step(model, impl, jit_compile=True)
  return step.experimental_get_compiler_ir(*model.input_values())(stage="hlo")


def _annotated_tensors(model):
  """(HLO op name, dim names, what) of every tensor whose sharding the test checks."""
  out = []
  for placeholder, _ in model.inputs:
    out.append((scope_name(placeholder.name), placeholder.shape.dimension_names,
                "input %s" % placeholder.name))
  for v in model.variables:
    name = v.operation.name
    for access in ("read", "write"):
      out.append((scope_name("%s_%s" % (name, access)), v.shape.dimension_names,
                  "variable %s (%s)" % (name, access)))
  for t in model.einsum_outputs():
    out.append((scope_name(t.name), t.shape.dimension_names, "einsum output %s" % t.name))
  return out


def _check_shardings(hlo, model, rules, device_of_pnum=None):
  shardings = gspmd_hlo.shardings_by_op_name(hlo)
  checked = 0
  for op_name, dim_names, what in _annotated_tensors(model):
    key = op_name + "/XlaSharding"
    assert key in shardings, "%s: no Sharding named %s in the HLO" % (what, key)
    got = gspmd_hlo.device_blocks(shardings[key], len(dim_names), 8)
    want = gspmd_hlo.expected_blocks(dim_names, rules, MESH_SIZES, device_of_pnum)
    assert got == want, "%s %s: sharding {%s}, expected blocks %s" % (
        what, dim_names, shardings[key], want)
    checked += 1
  return checked


@pytest.mark.parametrize("model_name,layout_name", CASES)
def test_step_hlo_carries_layout_shardings(model_name, layout_name):
  build, layouts = gspmd_models.BUILDERS[model_name]
  model = build()
  layout = layouts[layout_name]
  hlo = _step_hlo(model, mtf.GSPMDMeshImpl(gspmd_models.MESH_SHAPE, layout))
  checked = _check_shardings(hlo, model, _rules(layout))
  assert checked >= len(model.einsum_outputs()) + 2 * len(model.variables) + 1
  assert not gspmd_hlo.unannotated_parameters(hlo)
  # Some tensor really is split (the check is not vacuous on replicated shardings).
  assert "devices=[" in hlo


def test_device_mesh_follows_the_logical_to_physical_map():
  model = gspmd_models.build_mlp()
  layout = gspmd_models.MLP_LAYOUTS["dp_mp"]
  physical = [7, 5, 3, 1, 6, 4, 2, 0]
  impl = mtf.GSPMDMeshImpl(gspmd_models.MESH_SHAPE, layout, device_assignment=physical)
  assert impl.device_mesh.tolist() == [[7, 5, 3, 1], [6, 4, 2, 0]]
  hlo = _step_hlo(model, impl)
  _check_shardings(hlo, model, _rules(layout), device_of_pnum=physical)
  with pytest.raises(AssertionError):  # the identity map would be wrong here
    _check_shardings(hlo, model, _rules(layout))


def test_replicated_layout_gives_replicated_shardings():
  model = gspmd_models.build_mlp()
  hlo = _step_hlo(model, mtf.GSPMDMeshImpl(gspmd_models.MESH_SHAPE, ""))
  _check_shardings(hlo, model, {})
  assert "devices=[" not in hlo
