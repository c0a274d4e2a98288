"""Installs mesh_tf (the library) and models (the Transformer built on it).

TensorFlow is chosen through an extra, so that a TPU VM, a GPU box and a laptop each get
the right wheel:  pip install -e .[cpu]   |   .[gpu]   |   .[tpu]

Supported: Python 3.10-3.13, TensorFlow 2.19-2.21 (TF 2.19 is the oldest that Colab
ships; PyPI has no TF 2.19 wheel for Python 3.13). tools/check_matrix.sh installs and
tests every admitted (Python, TF) pair; tests/test_packaging.py keeps these ranges, the
Makefile and the README in step.
"""
import setuptools

PYTHON_REQUIRES = ">=3.10"
TF_VERSION = ">=2.19,<2.22"
# tensorflow-tpu stops at 2.20 on PyPI (no 2.21 wheel), so the tpu extra asks for what
# exists; TPU VMs also need libtpu from Google's libtpu release index (`pip -f`).
TPU_TF_VERSION = ">=2.19,<2.21"
# tensorflow-metadata 1.18+ ships protobuf 6.31 generated code, which refuses to import
# on the protobuf 5.x runtime that TF 2.19 pins; 1.17.x (protobuf 4.25 generated code)
# imports on every protobuf that TF 2.19-2.21 accept. tensorflow-datasets itself does not
# bound it, so every extra that pulls tensorflow-datasets carries this bound.
TFDS = ["tensorflow-datasets", "tensorflow-metadata<1.18"]
# jax/jaxlib run XLA's SPMD partitioner on host CPUs in the GSPMD tests (version verified
# with TF 2.19-2.21); 0.10.2 has wheels for Python >= 3.11 only, and the GSPMD tests skip
# with that reason on 3.10. Every jax requirement carries this marker.
JAX_MARKER = '; python_version >= "3.11"'
# ml_dtypes 0.7.0's extension module takes 1.3 s to import on this project's 2-core CI
# host (0.6.0 and 0.5.4: 0.02 s), and every process that imports TensorFlow pays it:
# each trainer start, each SPMD peer, each test subprocess. TF 2.19-2.21 and jax accept
# 0.5.1-0.6.x.
ML_DTYPES = "ml_dtypes<0.7"

setuptools.setup(
    name="mesh_tf",
    version="0.1.0",
    description="Mesh-TensorFlow for TensorFlow 2: named dimensions, layout rules, "
                "SPMD lowering onto meshes of processors.",
    packages=setuptools.find_packages(include=["mesh_tf", "mesh_tf.*",
                                               "models", "models.*"]),
    python_requires=PYTHON_REQUIRES,
    install_requires=["absl-py", "gin-config", "numpy", ML_DTYPES],
    extras_require={
        "cpu": ["tensorflow-cpu" + TF_VERSION],
        "gpu": ["tensorflow[and-cuda]" + TF_VERSION],
        "tpu": ["tensorflow-tpu" + TPU_TF_VERSION],
        "data": TFDS,
        "text": ["sentencepiece"],
        # nbclient/nbformat/ipykernel execute colab/ notebooks; matplotlib draws their
        # training curves.
        "test": ["pytest", "pytest-xdist>=3.8", "hypothesis",
                 "jax==0.10.2" + JAX_MARKER, "jaxlib==0.10.2" + JAX_MARKER,
                 "nbclient", "nbformat", "ipykernel", "matplotlib",
                 "sentencepiece"] + TFDS,
    },
)
