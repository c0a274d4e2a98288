"""GSPMD gives the numbers of the placement and SIMD backends: loss, gradients, updates.

Each case runs one SGD step of the MLP or the Transformer layer: placement on 8 virtual
CPUs and SIMD in its CPU emulation (both eagerly), GSPMD under tf.function(jit_compile=True)
or eagerly.
"""
import numpy as np
import pytest

import mesh_tf as mtf
from mesh_tf.backends.simd import SimdMeshImpl

import gspmd_models

DEVICES = ["/cpu:%d" % i for i in range(8)]
CASES = [(model, layout) for model, (_, layouts) in gspmd_models.BUILDERS.items()
         for layout in layouts]


def _assert_same(got, want, what):
  (outs, after), (ref_outs, ref_after) = got, want
  labels = ["loss"] + ["gradient %d" % i for i in range(len(outs) - 1)]
  for label, a, b in zip(labels, outs, ref_outs):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg="%s: %s" % (what, label))
  assert sorted(after) == sorted(ref_after)
  for name in after:
    np.testing.assert_allclose(after[name], ref_after[name], rtol=2e-5, atol=2e-6,
                               err_msg="%s: variable %s after the step" % (what, name))


@pytest.mark.parametrize("model_name,layout_name", CASES)
def test_gspmd_step_matches_placement_and_simd(model_name, layout_name):
  build, layouts = gspmd_models.BUILDERS[model_name]
  layout = layouts[layout_name]
  shape = gspmd_models.MESH_SHAPE
  placement = gspmd_models.run_step(build(), mtf.PlacementMeshImpl(shape, layout, DEVICES),
                                     eager=True)
  # XLA compiles slowly on a loaded 2-core machine: jit the dp+mp cases, run the others
  # eagerly (the same global program; the shardings are identities there).
  jit = layout_name == "dp_mp"
  gspmd = gspmd_models.run_step(build(), mtf.GSPMDMeshImpl(shape, layout), jit_compile=jit,
                                eager=not jit)
  _assert_same(gspmd, placement, "gspmd vs placement")
  simd = gspmd_models.run_step(build(), SimdMeshImpl(shape, layout), eager=True)
  _assert_same(gspmd, simd, "gspmd vs simd")
  # A step really happened: the update moved the variables.
  model = build()
  impl = mtf.GSPMDMeshImpl(shape, layout)
  mtf.Lowering(model.graph, {model.mesh: impl})
  before = {n: impl.variable_store[n].read_full().numpy() for n in model.variable_names}
  assert any(np.abs(before[n] - gspmd[1][n]).max() > 1e-6 for n in before)


def test_gspmd_runs_eagerly_and_unjitted_too():
  layout = gspmd_models.MLP_LAYOUTS["dp_mp"]
  shape = gspmd_models.MESH_SHAPE
  ref = gspmd_models.run_step(gspmd_models.build_mlp(),
                              mtf.PlacementMeshImpl(shape, layout, DEVICES))
  unjitted = gspmd_models.run_step(gspmd_models.build_mlp(), mtf.GSPMDMeshImpl(shape, layout))
  # tf.function without XLA: the XlaSharding ops run as identities.
  _assert_same(unjitted, ref, "gspmd (tf.function) vs placement")
  model = gspmd_models.build_mlp()
  impl = mtf.GSPMDMeshImpl(shape, layout)
  lowering = mtf.Lowering(model.graph, {model.mesh: impl},
                          feeds={p: v for p, v in model.inputs})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(model.loss).numpy(), ref[0][0],
                             rtol=1e-5)


def test_variables_are_global_and_checkpoint_across_backends(tmp_path):
  layout = gspmd_models.MLP_LAYOUTS["dp_mp"]
  model = gspmd_models.build_mlp()
  impl = mtf.GSPMDMeshImpl(gspmd_models.MESH_SHAPE, layout)
  step = gspmd_models.make_step(model, impl, jit_compile=True)
  step(*model.input_values())
  w1 = impl.variable_store["w1"]
  assert [v.shape.as_list() for v in w1.slice_variables] == [[12, 16]]  # one full copy
  assert len(w1.laid_out_tensor.all_slices) == 1
  path = mtf.save_checkpoint(str(tmp_path / "gspmd.ckpt"), impl, global_step=1)
  placement = mtf.PlacementMeshImpl(gspmd_models.MESH_SHAPE, layout, DEVICES)
  mtf.Lowering(model.graph, {model.mesh: placement})
  mtf.restore_checkpoint(path, placement)
  for name in model.variable_names:
    np.testing.assert_array_equal(placement.variable_store[name].read_full().numpy(),
                                  impl.variable_store[name].read_full().numpy())
  # ...and back: a placement checkpoint restores into a fresh GSPMD mesh.
  path2 = mtf.save_checkpoint(str(tmp_path / "placement.ckpt"), placement, global_step=1)
  fresh = mtf.GSPMDMeshImpl("all:8", "hidden:all")
  mtf.Lowering(model.graph, {model.mesh: fresh})
  mtf.restore_checkpoint(path2, fresh)
  np.testing.assert_array_equal(fresh.variable_store["w2"].read_full().numpy(),
                                impl.variable_store["w2"].read_full().numpy())
