"""Fixtures of the TPU contract tests: a MirroredStrategy over the 8 virtual CPUs, the
collective stand-ins installed in tf.raw_ops, and a TPU device assignment for a mesh."""
import os
import sys

import pytest
import tensorflow as tf

# The GSPMD tests' MLP and Transformer layer are reused here.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gspmd"))

import tpu_standins  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_CORES = 8


@pytest.fixture(scope="session")
def strategy():
  """Replica r on /cpu:r, as device_assignment_for_mesh puts replica r on core r."""
  return tf.distribute.MirroredStrategy(["/cpu:%d" % i for i in range(NUM_CORES)])


@pytest.fixture
def standins(strategy, monkeypatch):  # pylint: disable=redefined-outer-name
  """The TPU collectives' stand-ins, in tf.raw_ops for this test only."""
  return tpu_standins.TpuCollectiveStandIns(strategy).install(monkeypatch)


@pytest.fixture(scope="session")
def device_assignment():
  """A DeviceAssignment of 8 replicas on a [2, 2, 1, 2] topology (no TPU needed)."""
  from mesh_tf.backends import simd_tpu  # pylint: disable=g-import-not-at-top
  return simd_tpu.device_assignment_for_mesh(tpu_standins.fake_topology([2, 2, 1, 2]))
