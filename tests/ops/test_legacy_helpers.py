"""parallel and verify_no_new_dims (mesh_tf/ops/legacy_helpers.py)."""
import pytest
import tensorflow as tf

import mesh_tf as mtf


def test_parallel_runs_once_per_device():
  devices = ["/cpu:0", "/cpu:3"]
  out = mtf.parallel(devices, lambda a, b=None: tf.identity(a * b),
                     [tf.constant(2.0), tf.constant(3.0)], b=[10.0, 100.0])
  assert [float(t) for t in out] == [20.0, 300.0]
  assert [tf.DeviceSpec.from_string(t.device).device_index for t in out] == [0, 3]
  with pytest.raises(mtf.ShapeError, match="argument 0 must be a list with one entry"):
    mtf.parallel(devices, lambda a: a, [1])
  with pytest.raises(mtf.ShapeError, match="keyword argument 'b'"):
    mtf.parallel(devices, lambda b: b, b=(1, 2))
  with pytest.raises(mtf.ShapeError, match="devices must be a list"):
    mtf.parallel("/cpu:0", lambda: 0)


def test_verify_no_new_dims():
  mtf.verify_no_new_dims([mtf.Shape([]), "a:2;b:3", [("c", 4)]], "b:3;c:4")
  with pytest.raises(mtf.ShapeError, match="dims \\['d:5'\\] found in no input"):
    mtf.verify_no_new_dims(["a:2"], "a:2;d:5")
  with pytest.raises(mtf.ShapeError, match="a:3"):
    mtf.verify_no_new_dims(["a:2"], "a:3")
