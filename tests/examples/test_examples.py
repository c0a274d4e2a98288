"""The examples in the original's style (models/examples) train on synthetic data, with
the same losses on one device and on a 2x2 mesh."""
import numpy as np
import pytest
import tensorflow as tf

from models.examples import mnist, toy_model

MESH_2X2 = ["/cpu:%d" % i for i in range(4)]


def test_mnist_conv_net_with_blocks_on_one_device_and_a_2x2_mesh():
  single = mnist.train("", "", [""], 20)
  spatial = mnist.train("b1:2;b2:2", "row_blocks:b1;col_blocks:b2", MESH_2X2, 20)
  np.testing.assert_allclose(spatial, single, rtol=1e-4, atol=1e-5)
  assert np.mean(single[-3:]) < 0.5 * np.mean(single[:3]), single


@pytest.mark.parametrize("optimizer,learning_rate", [("SGD", 0.1), ("Adafactor", 0.05)])
def test_toy_model_with_the_originals_optimizers_and_utils(tmp_path, optimizer,
                                                           learning_rate):
  single = toy_model.train("", "", [""], 12, optimizer=optimizer,
                           learning_rate=learning_rate, model_dir=str(tmp_path))
  mesh = toy_model.train("b1:2;b2:2", "batch:b1;hidden:b2", MESH_2X2, 12,
                         optimizer=optimizer, learning_rate=learning_rate)
  np.testing.assert_allclose(mesh, single, rtol=1e-4, atol=1e-6)
  assert np.mean(single[-3:]) < 0.7 * np.mean(single[:3]), single
  # The host call wrote the loss of every step, at steps 0..11.
  logged = {}
  for event_file in tmp_path.iterdir():
    for event in tf.compat.v1.train.summary_iterator(str(event_file)):
      for value in event.summary.value:
        if value.tag == "loss":
          logged[event.step] = float(tf.make_ndarray(value.tensor))
  assert sorted(logged) == list(range(12))
  np.testing.assert_allclose([logged[i] for i in range(12)], single, rtol=1e-6)
