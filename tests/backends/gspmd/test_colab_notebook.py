"""The colab notebook runs top to bottom on CPU (its 8-core emulation branch).

Executed with nbclient in a fresh kernel, so the notebook cannot rot: its own cells assert
that the loss falls and that placement, SIMD and GSPMD give the same numbers.
"""
import os

import nbclient  # the test extra
import nbformat

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
NOTEBOOK = os.path.join(REPO, "colab", "mesh_tf_tpu_or_cpu.ipynb")


def _outputs_text(cell):
  return "".join(o.get("text", "") for o in cell.get("outputs", []))


def test_notebook_runs_on_cpu_emulation(tmp_path, monkeypatch):
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
  # The kernel needs IPython and matplotlib, which conftest.py hides from subprocesses.
  monkeypatch.delenv("MESH_TF_TEST_HIDDEN_MODULES", raising=False)
  monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's model_dir lands here
  client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": REPO}})
  client.execute()
  text = "\n".join(_outputs_text(c) for c in notebook.cells if c.cell_type == "code")
  assert "CPU emulation of 8 cores" in text
  for backend in ("placement", "simd", "gspmd"):
    assert "%-9s MLP loss" % backend in text
    assert "%-9s Transformer loss" % backend in text
  assert "every lowering gives the same numbers" in text
  assert "devices=[" in text  # the HLO cell found split shardings
  assert "mesh_tf from" in text  # the install cell found the package, installed nothing
  assert "ff_in" in text and "d_ff" in text  # the sharding pictures of a weight, an activation
  assert "train loss:" in text and "eval loss:" in text  # the curves read back from TensorBoard
  images = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]
  assert len(images) >= 2  # the sharding figure and the loss curves
