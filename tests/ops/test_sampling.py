"""sample_with_temperature (mesh_tf/ops/sampling.py): argmax at 0, the softmax
distribution otherwise, and the same samples on every layout."""
import functools

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, assert_close, lower_and_export, new_mesh, random_array

SAMPLES = mtf.Dimension("samples", 512)
LOGITS = np.log(np.array([0.05, 0.1, 0.2, 0.3, 0.15, 0.1, 0.06, 0.04], np.float32))


def _sampling_graph(temperature):
  """Samples over hidden from LOGITS, repeated along [batch, samples] (4096 draws)."""
  graph, mesh = new_mesh()
  logits = mtf.import_tf_tensor(mesh, LOGITS, [HIDDEN])
  logits = mtf.broadcast(logits, [BATCH, SAMPLES, HIDDEN])
  return graph, mesh, [mtf.sample_with_temperature(logits, HIDDEN, temperature)]


@functools.lru_cache(maxsize=None)
def _single_device_samples(temperature):
  graph, mesh, tensors = _sampling_graph(temperature)
  return lower_and_export(graph, mesh, mtf.PlacementMeshImpl("", ""), tensors)[0]


def test_temperature_zero_is_argmax(mesh_impl):
  x = random_array([BATCH, HIDDEN], 0)
  graph, mesh = new_mesh()
  logits = mtf.import_tf_tensor(mesh, x, [BATCH, HIDDEN])
  samples = [mtf.sample_with_temperature(logits, HIDDEN, 0.0),
             mtf.sample_with_temperature(logits, BATCH, temperature=0.0)]
  got = lower_and_export(graph, mesh, mesh_impl, samples)
  assert_close(got[0], np.argmax(x, 1).astype(np.int32), "argmax over hidden")
  assert_close(got[1], np.argmax(x, 0).astype(np.int32), "argmax over batch")


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_samples_follow_softmax_on_every_layout(mesh_impl, temperature):
  graph, mesh, tensors = _sampling_graph(temperature)
  got = lower_and_export(graph, mesh, mesh_impl, tensors)[0]
  # Layout-independent: the noise is a function of the global index.
  np.testing.assert_array_equal(got, _single_device_samples(temperature))
  assert got.shape == (8, 512) and got.dtype == np.int32
  freq = np.bincount(got.ravel(), minlength=8) / got.size
  expected = tf.nn.softmax(LOGITS / temperature).numpy()
  # 4096 draws: the standard error of each frequency is below 0.008; allow 4 of them.
  np.testing.assert_allclose(freq, expected, atol=0.032)


def test_temperature_as_tensor(make_mesh_impl):
  graph, mesh = new_mesh()
  logits = mtf.broadcast(mtf.import_tf_tensor(mesh, LOGITS, [HIDDEN]),
                         [BATCH, SAMPLES, HIDDEN])
  # Temperature 0 on even batch rows (argmax = 3), 1 on odd ones.
  temps = mtf.import_tf_tensor(mesh, np.tile([0.0, 1.0], 4).astype(np.float32), [BATCH])
  samples = mtf.sample_with_temperature(logits, HIDDEN, temps)
  got = lower_and_export(graph, mesh, make_mesh_impl("all:8", "batch:all"), [samples])[0]
  assert (got[0::2] == 3).all()
  assert len(np.unique(got[1::2])) == 8


def test_sampling_errors():
  _, mesh = new_mesh()
  logits = mtf.import_tf_tensor(mesh, LOGITS, [HIDDEN])
  with pytest.raises(mtf.ShapeError, match="batch"):
    mtf.sample_with_temperature(logits, BATCH)
  with pytest.raises(mtf.ShapeError, match="negative"):
    mtf.sample_with_temperature(logits, HIDDEN, -1.0)
