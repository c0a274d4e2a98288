"""The original library's LM checkpoint fixture (shared/fixtures/orig_mtf_lm): where it
is, the mesh cases the tests reproduce it on, and running a model restored from it."""
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import transformer

FIXTURE = (pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
           / "orig_mtf_lm")
CPUS = ["/cpu:%d" % i for i in range(8)]
# One device, and a 2x4 mesh splitting the batch and heads / d_ff / vocab.
MESH_CASES = pytest.mark.parametrize("mesh_shape,layout,devices", [
    ("", "", [""]),
    ("rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols;vocab:cols", CPUS),
], ids=["mesh=[]", "mesh=2x4/dp+mp"])


def run_restored(model, mesh_shape, layout, devices, mode, variable_dtype):
  """The model's (logits, loss) on the fixture's eval batch, restored from its checkpoint
  on the given mesh; returns (logits, loss, RestoreResult, mesh_impl)."""
  targets_np = np.load(FIXTURE / "inputs.npy")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  shape = [mtf.Dimension("batch", 2), mtf.Dimension("length", 16)]
  targets = mtf.import_tf_tensor(mesh, tf.constant(targets_np, tf.int32), shape)
  logits, loss = model.call_simple(
      transformer.autoregressive_inputs(targets), targets, compute_loss=True, mode=mode,
      variable_dtype=variable_dtype)
  impl = mtf.PlacementMeshImpl(mesh_shape, layout, devices)
  lowering = mtf.Lowering(graph, {mesh: impl})
  result = mtf.restore_checkpoint(str(FIXTURE / "model.ckpt-20"), lowering)
  assert not result.missing
  return (lowering.export_to_tf_tensor(logits).numpy(),
          float(lowering.export_to_tf_tensor(loss).numpy()), result, impl)


def check_against_original(logits, loss):
  """Asserts logits and loss equal what the original library computed."""
  expected_logits = np.load(FIXTURE / "logits.npy")
  assert logits.shape == expected_logits.shape == (2, 16, 128)
  np.testing.assert_allclose(logits, expected_logits, atol=1e-4, rtol=0)
  np.testing.assert_allclose(loss, float((FIXTURE / "loss.txt").read_text()), rtol=1e-5)
