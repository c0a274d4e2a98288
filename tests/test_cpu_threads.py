"""mesh_tf.cpu_threads: virtual CPUs that share the cores get ops of cores // devices
threads, unless the user sized TensorFlow's pools; the MFU peak still times every core.
Pool sizes are fixed when TensorFlow starts, so each case runs in a fresh process."""
import json
import os
import subprocess
import sys

import pytest

from mesh_tf import cpu_threads
from models.transformer.trainer import step_metrics

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = ("import json, tensorflow as tf\n"
          "from mesh_tf import utils\n"
          "{before}\n"
          "utils.configure_virtual_cpus({devices})\n"
          "t = tf.config.threading\n"
          "print(json.dumps([t.get_intra_op_parallelism_threads(),"
          " t.get_inter_op_parallelism_threads(), len(tf.config.list_logical_devices('CPU'))]))\n")


def _pools(devices, before="", **env_changes):
  env = {k: v for k, v in os.environ.items() if k not in ("TF_NUM_INTRAOP_THREADS",
                                                           "TF_NUM_INTEROP_THREADS")}
  env.update(env_changes, PYTHONPATH=REPO_ROOT)
  out = subprocess.run([sys.executable, "-c", REPORT.format(devices=devices, before=before)],
                       env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                       check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_pool_sizes():
  assert cpu_threads.pool_sizes(2, 8) == (1, 2)
  assert cpu_threads.pool_sizes(16, 4) == (4, 16)
  assert cpu_threads.pool_sizes(16, 0) == (16, 16)  # no CPU devices (GPUs)
  assert cpu_threads.pool_sizes(0, 3) == (1, 1)
  assert cpu_threads.describe((1, 2)) == "1 thread per op, 2 ops at once"
  assert cpu_threads.describe((2, 1)) == "2 threads per op, 1 op at once"
  assert cpu_threads.describe(None) == ""


def test_virtual_cpus_share_the_cores_unless_the_user_chose():
  cores = cpu_threads.host_cores()
  assert _pools(8) == [max(1, cores // 8), cores, 8]
  assert _pools(1) == [0, 0, 1]  # one device: TensorFlow's own sizing
  # the user's choice is kept: environment, or tf.config.threading before
  assert _pools(8, TF_NUM_INTRAOP_THREADS="3") == [0, 0, 8]
  assert _pools(4, before="tf.config.threading.set_inter_op_parallelism_threads(5)") == [
      0, 5, 4]
  # TensorFlow already started (devices made): sizing is skipped, no error
  assert _pools(1, before="tf.constant(1.0)\nfrom mesh_tf import cpu_threads\n"
                "assert cpu_threads.apply((1, 1)) is None") == [0, 0, 1]


def test_the_peak_runs_one_matmul_per_thread_group_side_by_side(monkeypatch):
  """With one thread per op on 4 cores a calibration round is 4 matmuls at once, so the
  peak is the host's, not one core's; with every core per op, one matmul."""
  workers = []
  real = step_metrics.futures.ThreadPoolExecutor

  def recording(n):
    workers.append(n)
    return real(n)
  monkeypatch.setattr(step_metrics.futures, "ThreadPoolExecutor", recording)
  monkeypatch.setattr(cpu_threads, "host_cores", lambda: 4)
  for intra, side_by_side, size in ((1, 4, 24), (4, 1, 40), (2, 2, 56)):
    monkeypatch.setattr(cpu_threads, "intra_op_threads", lambda n=intra: n)
    assert step_metrics.measure_peak_flops(size=size, budget_seconds=0.05) > 0
    assert workers[-1] == side_by_side


@pytest.mark.parametrize("env,expected", [({"TF_NUM_INTRAOP_THREADS": "3"}, 3), ({}, None)])
def test_intra_op_threads_reads_the_environment(monkeypatch, env, expected):
  monkeypatch.delenv("TF_NUM_INTRAOP_THREADS", raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  # the suite's process sized nothing through tf.config: the environment or every core
  got = cpu_threads.intra_op_threads()
  assert got == (expected or cpu_threads.host_cores())
