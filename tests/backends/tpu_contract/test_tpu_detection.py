"""The notebook finds a TPU from Colab's and a TPU VM's environment, and says so.

TPUClusterResolver, connect_to_cluster and initialize_tpu_system are replaced by fakes
that record how they are called; the notebook's first cell is executed as it is.
"""
import json
import os

import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends import tpu_detection

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
NOTEBOOK = os.path.join(REPO, "colab", "mesh_tf_tpu_or_cpu.ipynb")
COLAB = {"COLAB_TPU_ADDR": "10.1.2.3:8470", "HOME": "/root"}
TOPOLOGY = object()


class FakeTpu:
  """Records the resolver's arguments and the connect / initialize calls."""

  def __init__(self, error=None):
    self.error = error
    self.resolver_kwargs = []
    self.connected = []
    self.initialized = []
    fake = self

    class Resolver:
      def __init__(self, **kwargs):
        fake.resolver_kwargs.append(kwargs)
        if fake.error is not None:
          raise fake.error
    self.resolver_class = Resolver

  def connect(self, resolver):
    self.connected.append(resolver)

  def initialize(self, resolver):
    self.initialized.append(resolver)
    return TOPOLOGY

  def find(self, environ, path_exists=lambda path: False):
    return tpu_detection.find_tpu(environ, path_exists, self.resolver_class, self.connect,
                                  self.initialize)


def test_colab_runtime_connects_to_its_tpu_address():
  fake = FakeTpu()
  found = fake.find(COLAB)
  assert fake.resolver_kwargs == [{"tpu": "grpc://10.1.2.3:8470"}]
  assert len(fake.connected) == 1 and found.topology is TOPOLOGY
  assert found.branch == "tpu" and "COLAB_TPU_ADDR=10.1.2.3:8470" in found.reason


@pytest.mark.parametrize("environ,path", [({}, tpu_detection.TPU_VM_DEVICE),
                                          ({"TPU_ACCELERATOR_TYPE": "v4-8"}, None)])
def test_tpu_vm_uses_the_local_tpu(environ, path):
  fake = FakeTpu()
  found = fake.find(environ, lambda p: p == path)
  assert fake.resolver_kwargs == [{"tpu": "local"}]
  assert len(fake.connected) == len(fake.initialized) == 1
  assert found.branch == "tpu" and "TPU VM" in found.reason


def test_tpu_name_is_left_to_the_resolver():
  fake = FakeTpu()
  found = fake.find({"TPU_NAME": "my-tpu", **COLAB})
  assert fake.resolver_kwargs == [{}] and found.branch == "tpu"
  assert "TPU_NAME=my-tpu" in found.reason


def test_no_tpu_means_cpu_without_trying():
  fake = FakeTpu()
  found = fake.find({"HOME": "/root"})
  assert not fake.resolver_kwargs and found.branch == "cpu" and found.topology is None
  assert "no TPU in this environment" in found.reason


def test_a_failed_connection_is_reported():
  fake = FakeTpu(ValueError("Please provide a TPU Name to connect to."))
  found = fake.find(COLAB)
  assert found.branch == "cpu" and found.resolver is None
  assert "Colab TPU runtime" in found.reason
  assert "ValueError: Please provide a TPU Name" in found.reason


@pytest.mark.parametrize("cores,mesh", [(8, "rows:2;cols:4"), (4, "rows:2;cols:2"),
                                        (32, "rows:2;cols:16"), (2, "rows:1;cols:2"),
                                        (1, "rows:1;cols:1"), (3, "rows:1;cols:3")])
def test_mesh_uses_every_core(cores, mesh):
  assert tpu_detection.mesh_shape_for_cores(cores) == mesh
  assert mtf.convert_to_shape(mesh).size == cores
  with pytest.raises(mtf.LayoutError, match="at least one core"):
    tpu_detection.mesh_shape_for_cores(0)


def _branch_cell():
  """The notebook's code cell that picks the branch (after the install cell)."""
  with open(NOTEBOOK) as f:
    cells = json.load(f)["cells"]
  return next("".join(c["source"]) for c in cells
              if c["cell_type"] == "code" and "find_tpu()" in "".join(c["source"]))


@pytest.mark.parametrize("environ,device_exists,branch,why", [
    (COLAB, False, "tpu", "Colab TPU runtime (COLAB_TPU_ADDR=10.1.2.3:8470)"),
    ({}, True, "tpu", "TPU VM (/dev/accel0 exists)"),
    ({}, False, "cpu", "no TPU in this environment"),
])
def test_notebook_cell_prints_its_branch(monkeypatch, capsys, tmp_path, environ,
                                         device_exists, branch, why):
  fake = FakeTpu()
  for name in (tpu_detection.RESOLVER_ENV_VARS + tpu_detection.TPU_VM_ENV_VARS +
               ("COLAB_TPU_ADDR",)):
    monkeypatch.delenv(name, raising=False)
  for name, value in environ.items():
    monkeypatch.setenv(name, value)
  device = tmp_path / "accel0"
  if device_exists:
    device.write_text("")
  monkeypatch.setattr(tpu_detection, "TPU_VM_DEVICE", str(device))
  monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver",
                      fake.resolver_class)
  monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", fake.connect)
  monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", fake.initialize)
  namespace = {}
  exec(compile(_branch_cell(), NOTEBOOK, "exec"), namespace)  # pylint: disable=exec-used
  printed = capsys.readouterr().out
  assert namespace["ON_TPU"] is (branch == "tpu")
  assert "branch: %s, because %s" % (branch, why.replace("/dev/accel0", str(device))) in printed
  assert ("TPU |" in printed) is (branch == "tpu")
