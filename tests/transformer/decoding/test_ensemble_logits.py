"""reduce_ensemble_logits* against numpy, on one device and with the ensemble and vocab
dims split over a 2x4 mesh; and utils.tpu_mesh_shape."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import transformer
from models.transformer import utils

CPUS = ["/cpu:%d" % i for i in range(8)]
ENSEMBLE, BATCH, VOCAB = mtf.Dimension("ensemble", 2), mtf.Dimension("batch", 3), \
    mtf.Dimension("vocab", 8)


def _reduce(fn, mesh_shape, layout, devices, **kwargs):
  logits_np = np.random.RandomState(0).randn(2, 3, 8).astype(np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  logits = mtf.import_tf_tensor(mesh, tf.constant(logits_np), [ENSEMBLE, BATCH, VOCAB])
  out = fn(logits, ENSEMBLE, VOCAB, **kwargs)
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl(mesh_shape, layout,
                                                                devices)})
  assert out.shape.dims == [BATCH, VOCAB]
  return lowering.export_to_tf_tensor(out).numpy(), logits_np


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("mesh_shape,layout,devices", [
    ("", "", [""]), ("rows:2;cols:4", "ensemble:rows;vocab:cols", CPUS)],
                         ids=["mesh=[]", "mesh=2x4"])
def test_reducers_match_numpy(mesh_shape, layout, devices):
  out, x = _reduce(transformer.reduce_ensemble_logits, mesh_shape, layout, devices)
  np.testing.assert_allclose(out, np.log(_softmax(x).mean(0)), rtol=1e-5, atol=1e-6)
  out, x = _reduce(transformer.reduce_ensemble_logits_mean_logit, mesh_shape, layout,
                   devices)
  np.testing.assert_allclose(out, x.mean(0), rtol=1e-5, atol=1e-6)
  out, x = _reduce(transformer.reduce_ensemble_logits_select, mesh_shape, layout,
                   devices, model_id=1)
  np.testing.assert_allclose(out, x[1])
  out, x = _reduce(transformer.reduce_ensemble_logits, mesh_shape, layout, devices,
                   reduce_fn=transformer.reduce_ensemble_logits_mean_logit)
  np.testing.assert_allclose(out, x.mean(0), rtol=1e-5, atol=1e-6)


def test_reducers_reject_missing_dim_and_bad_member():
  with pytest.raises(mtf.ShapeError, match="model_id 2"):
    _reduce(transformer.reduce_ensemble_logits_select, "", "", [""], model_id=2)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  logits = mtf.zeros(mesh, [BATCH, VOCAB])
  with pytest.raises(mtf.ShapeError, match="ensemble"):
    transformer.reduce_ensemble_logits(logits, ENSEMBLE, VOCAB)


def test_tpu_mesh_shape():
  assert utils.tpu_mesh_shape("4x4", 8) == mtf.Shape(
      [mtf.Dimension("batch", 4), mtf.Dimension("model", 8)])
  # As in the original, size-1 dims are left out.
  assert utils.tpu_mesh_shape("2x2", 1) == mtf.Shape([mtf.Dimension("batch", 8)])
  assert utils.tpu_mesh_shape("v2-8", 8) == mtf.Shape([mtf.Dimension("model", 8)])
  assert utils.tpu_mesh_shape("v3-32", 4).to_integer_list == [8, 4]
  assert utils.tpu_mesh_shape("2x2x4", 4).to_integer_list == [4, 4]
  shape = utils.tpu_mesh_shape("8x8", 16, ensemble_parallelism=2)
  assert [(d.name, d.size) for d in shape.dims] == [("ensemble", 2), ("batch", 4),
                                                    ("model", 16)]
  with pytest.raises(mtf.MtfError, match="does not divide the 32 cores"):
    utils.tpu_mesh_shape("4x4", 3)
  with pytest.raises(mtf.MtfError, match="v3-8x"):
    utils.tpu_mesh_shape("v3-8x", 2)
