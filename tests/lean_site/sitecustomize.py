"""Hides the modules named in MESH_TF_TEST_HIDDEN_MODULES from the Python subprocesses that
tests start (tests/conftest.py puts this folder on their PYTHONPATH).

With the test extra installed, `import tensorflow` also imports jax (through tf.lite),
matplotlib and IPython (through Keras), each inside `try: ... except ImportError`: about
2 s of every subprocess's start on a 2-core host, for packages that no trainer uses. A
module set to None in sys.modules raises ImportError when imported, so TensorFlow and Keras
go on without it, as they do in the `make train` environment, which lacks those packages.
"""
import os
import sys

for _name in os.environ.get("MESH_TF_TEST_HIDDEN_MODULES", "").split(","):
  if _name.strip():
    sys.modules.setdefault(_name.strip(), None)
