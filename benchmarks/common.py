"""Shared benchmark helpers: virtual CPU set-up, alternating timing, table printing.

Benchmarks print ratios against a baseline measured in the same run; absolute times
depend on the machine and are printed only for context.
"""
import json
import os
import platform
import statistics
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Sizes of models.tiny_lm used by the benchmarks.
LM_SIZES = {
    "tiny": dict(batch=8, length=8, vocab=32, d_model=16, heads=8, d_kv=4, d_ff=32,
                 num_layers=1),
    "small": dict(batch=16, length=64, vocab=256, d_model=128, heads=4, d_kv=32,
                  d_ff=512, num_layers=2),
    # the LM of benchmarks.step_time (issue 16's peer LM)
    "peer": dict(batch=32, length=128, vocab=2048, d_model=256, heads=8, d_kv=32,
                 d_ff=1024, num_layers=2),
}

# Sizes of the models.transformer LM of benchmarks.overhead. "small" is
# gin_configs/models/lm_cpu_small.gin with readme_lm.gin's batch, on the byte vocabulary
# (259 ids, padded to 384); "medium" is 4x wider, 2x deeper and 2x longer.
TRANSFORMER_SIZES = {
    "tiny": dict(batch=4, length=8, vocab=20, num_layers=1, d_model=16, d_ff=32,
                 num_heads=4, d_kv=4),
    "small": dict(batch=16, length=64, vocab=259, num_layers=2, d_model=64, d_ff=256,
                  num_heads=4, d_kv=16),
    "medium": dict(batch=16, length=128, vocab=259, num_layers=4, d_model=256,
                   d_ff=1024, num_heads=8, d_kv=32),
}




def mesh_layouts(devices=8):
  """(label, mesh shape, layout rules) of the tiny LM's single, dp, mp and dp+mp meshes
  over that many devices (benchmarks.step_time and benchmarks.layouts)."""
  return [
      ("single", "", ""),
      ("dp", "batch:%d" % devices, "batch:batch"),
      ("mp", "model:%d" % devices, "d_ff:model;heads:model;vocab:model"),
      ("dp+mp", "batch:2;model:%d" % (devices // 2),
       "batch:batch;d_ff:model;heads:model;vocab:model"),
  ]


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subprocess_env(**extra):
  """The environment of a benchmark's Python subprocess: this one's, with the repository
  first on PYTHONPATH (what was there before stays after it) and TF's info logs off."""
  path = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=path, **extra)


def last_json(stdout):
  """The last JSON line (one starting with "{") a benchmark subprocess printed."""
  return json.loads([l for l in stdout.splitlines() if l.startswith("{")][-1])


def run_together(argvs, what, timeout=900):
  """Starts a benchmark subprocess per argv (in the repository root, with
  subprocess_env()), waits for all and kills any left; returns the last JSON line of
  each. A failed one is a RuntimeError naming `what` and its index, with its stderr."""
  from mesh_tf.cluster import local  # pylint: disable=g-import-not-at-top
  procs = []
  try:
    for argv in argvs:
      procs.append(subprocess.Popen(argv, cwd=REPO_ROOT, env=subprocess_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True))
    outputs = [p.communicate(timeout=timeout) for p in procs]
  finally:
    local.stop(procs)
  for i, ((_, err), p) in enumerate(zip(outputs, procs)):
    if p.returncode:
      raise RuntimeError("%s, process %d, failed:\n%s" % (what, i, err[-3000:]))
  return [last_json(out) for out, _ in outputs]


def set_up_virtual_cpus(n, size_thread_pools=False):
  """Splits the CPU into n logical devices; must run before TensorFlow runs any op.

  TF's own pool sizes by default, unlike the trainer: most benchmarks time one device
  and 8 in the same process, and the trainer's one thread per op for 8 devices
  (size_thread_pools, mesh_tf.cpu_threads) would run the one-device rows on one core."""
  from mesh_tf import utils  # pylint: disable=g-import-not-at-top
  return utils.configure_virtual_cpus(n, size_thread_pools)


def time_alternating(fns, steps, repeats):
  """Median seconds per call of each fn, measured in rounds that alternate the fns.

  Args:
    fns: {label: zero-argument callable returning something with .numpy()}; each is
      called once first to trace and warm up.
    steps: calls per timed block.
    repeats: rounds; each round times one block of every fn in turn.

  Returns:
    {label: median seconds per call}.
  """
  for fn in fns.values():
    fn().numpy()
  samples = {k: [] for k in fns}
  for _ in range(repeats):
    for label, fn in fns.items():
      start = time.perf_counter()
      for _ in range(steps):
        out = fn()
      out.numpy()
      samples[label].append((time.perf_counter() - start) / steps)
  return {k: statistics.median(v) for k, v in samples.items()}


def machine_line():
  """One line describing the machine and TF version."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return "machine: %s, %d CPUs, Python %s, TensorFlow %s" % (
      platform.machine(), os.cpu_count(), platform.python_version(), tf.__version__)


def print_table(rows):
  """Prints rows (lists of str) as aligned columns; the first row is the header."""
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  for r in rows:
    print("  ".join(c.rjust(w) if i else c.ljust(w)
                    for i, (c, w) in enumerate(zip(r, widths))))


def define_flag(define, name, default, *args, **kwargs):
  """define(name, default, *args) (an absl flags.DEFINE_*) unless a benchmark module
  imported earlier into this process defined `name` already: the tests import several
  of them into one process, and only a script's own run reads the values."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  if name not in flags.FLAGS:
    define(name, default, *args, **kwargs)


def random_prompts(size, length, prompt_length, seed=0):
  """int32 [batch, length]: prompt_length random non-EOS byte ids, then zeros."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  s = TRANSFORMER_SIZES[size]
  rng = np.random.RandomState(seed)
  ids = np.zeros([s["batch"], length], np.int32)
  ids[:, :prompt_length] = rng.randint(2, s["vocab"], size=[s["batch"], prompt_length])
  return ids
