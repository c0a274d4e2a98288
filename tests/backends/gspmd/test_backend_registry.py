"""Choosing the lowering by name or by gin: the same model on placement, SIMD and GSPMD."""
import os
import re
import subprocess
import sys

import gin
import numpy as np
import pytest

import mesh_tf as mtf
from mesh_tf.backends import registry
from models.mlp.model import MlpModel, synthetic_digits

DEVICES = ["/cpu:%d" % i for i in range(8)]
MESH, LAYOUT = "rows:2;cols:4", "batch:rows;hidden:cols"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_names_give_their_backends():
  assert registry.backend_names() == ["gspmd", "placement", "simd"]
  assert isinstance(mtf.make_mesh_impl("placement", MESH, LAYOUT, DEVICES),
                    mtf.PlacementMeshImpl)
  assert isinstance(mtf.make_mesh_impl("simd", MESH, LAYOUT), mtf.SimdMeshImpl)
  impl = mtf.make_mesh_impl("gspmd", MESH, LAYOUT, DEVICES, logical_to_physical=[
      1, 0, 3, 2, 5, 4, 7, 6])
  assert isinstance(impl, mtf.GSPMDMeshImpl)
  assert impl.device_mesh.tolist() == [[1, 0, 3, 2], [5, 4, 7, 6]]


def test_unknown_backend_and_wrong_device_count():
  with pytest.raises(mtf.MtfError, match=r"'tpu_v9'.*gspmd.*placement.*simd"):
    mtf.make_mesh_impl("tpu_v9", MESH, LAYOUT)
  with pytest.raises(mtf.LayoutError, match=r"8 processors but 2 devices"):
    mtf.make_mesh_impl("gspmd", MESH, LAYOUT, DEVICES[:2])


def test_gin_switches_the_lowering_of_one_model(clean_gin):
  images, labels = synthetic_digits(16 * 2, seed=3)
  losses = {}
  for backend in registry.backend_names():
    gin.parse_config("make_mesh_impl.backend = %r" % backend)
    impl = mtf.make_mesh_impl(mesh_shape=MESH, layout=LAYOUT, devices=DEVICES)
    assert type(impl).__name__.lower().startswith(backend)
    model = MlpModel(batch_size=16, hidden_size=16)
    step = model.make_train_step(impl, jit_compile=backend == "gspmd")
    losses[backend] = [float(step(images[i * 16:(i + 1) * 16], labels[i * 16:(i + 1) * 16]))
                       for i in range(2)]
  assert losses["placement"][1] < losses["placement"][0]
  for backend in ("simd", "gspmd"):
    np.testing.assert_allclose(losses[backend], losses["placement"], rtol=1e-5,
                               err_msg=backend)


def test_mlp_trainer_runs_with_the_gspmd_backend(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "models.mlp.main", "--backend=gspmd", "--train_steps=2",
       "--model_dir=%s" % tmp_path,
       "--log_every=1", "--hidden_size=16", "--batch_size=16"],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "GSPMDMeshImpl" in proc.stdout
  assert "step    2/2" in proc.stdout
  difference = re.search(r"restored on one device: \S+ \(difference (\S+)\)", proc.stdout)
  assert difference and float(difference.group(1)) < 1e-4, proc.stdout


@pytest.mark.parametrize("backend", ["placement", "simd", "gspmd"])
def test_a_mesh_layout_given_is_the_backends_own(backend):
  layout = mtf.MeshLayout(MESH, LAYOUT)
  impl = mtf.make_mesh_impl(backend, layout, None, DEVICES)
  assert impl.mesh_layout is layout
  assert impl.shape == layout.shape and impl.layout_rules == layout.layout_rules
  assert list(impl.tensor_layout(mtf.Shape([mtf.Dimension("batch", 4)]))) == [0]
