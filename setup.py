"""Installs mesh_tf (the library) and models (the Transformer built on it).

TensorFlow is chosen through an extra, so that a TPU VM, a GPU box and a laptop each get
the right wheel:  pip install -e .[cpu]   |   .[gpu]   |   .[tpu]
"""
import setuptools

TF_VERSION = ">=2.16,<2.22"
# tensorflow-tpu stops at 2.20 on PyPI (no 2.21 wheel), so the tpu extra asks for what
# exists; TPU VMs also need libtpu from Google's libtpu release index (`pip -f`).
TPU_TF_VERSION = ">=2.16,<2.21"

setuptools.setup(
    name="mesh_tf",
    version="0.1.0",
    description="Mesh-TensorFlow for TensorFlow 2: named dimensions, layout rules, "
                "SPMD lowering onto meshes of processors.",
    packages=setuptools.find_packages(include=["mesh_tf", "mesh_tf.*",
                                               "models", "models.*"]),
    python_requires=">=3.9",
    install_requires=["absl-py", "gin-config", "numpy"],
    extras_require={
        "cpu": ["tensorflow-cpu" + TF_VERSION],
        "gpu": ["tensorflow[and-cuda]" + TF_VERSION],
        "tpu": ["tensorflow-tpu" + TPU_TF_VERSION],
        "data": ["tensorflow-datasets"],
        "text": ["sentencepiece"],
        # jax/jaxlib run XLA's SPMD partitioner on host CPUs in the GSPMD tests (version
        # verified with TF 2.21); nbclient/nbformat/ipykernel execute colab/ notebooks.
        "test": ["pytest", "pytest-xdist", "hypothesis", "jax==0.10.2", "jaxlib==0.10.2", "nbclient",
                 "nbformat", "ipykernel", "sentencepiece", "tensorflow-datasets"],
    },
)
