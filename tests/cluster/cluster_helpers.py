"""Local clusters for tests: worker processes on free loopback ports, always killed."""
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "transformer"))

import trainer_helpers  # pylint: disable=g-import-not-at-top,wrong-import-position

STARTUP_TIMEOUT = 90  # seconds for a worker to import TF and listen, on a loaded host


def env():
  """The environment subprocesses run in (this repository first on the path)."""
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT)


def free_ports(n):
  """n distinct loopback ports that were free a moment ago."""
  socks = []
  try:
    for _ in range(n):
      s = socket.socket()
      s.bind(("localhost", 0))
      socks.append(s)
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


def start_worker(addresses, task, virtual_cpus, log_dir):
  """Popen of `python -m mesh_tf.cluster.worker` for task; output to log_dir files."""
  log = open(os.path.join(str(log_dir), "worker%d.txt" % task), "a")
  return subprocess.Popen(
      [sys.executable, "-m", "mesh_tf.cluster.worker", "--cluster=" + ",".join(addresses),
       "--task=%d" % task, "--virtual_cpus=%d" % virtual_cpus],
      cwd=REPO_ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)


def wait_listening(addresses, procs, timeout=STARTUP_TIMEOUT):
  """Returns once every worker accepts connections; raises if one exits or is slow."""
  from mesh_tf.cluster import faults  # pylint: disable=g-import-not-at-top
  deadline = time.time() + timeout
  while True:
    for p in procs:
      if p.poll() is not None:
        raise RuntimeError("worker exited with %s before listening" % p.returncode)
    if not faults.lost_tasks(addresses, timeout=1.0):
      return
    if time.time() > deadline:
      raise RuntimeError("workers %s not listening after %ds" % (addresses, timeout))
    time.sleep(0.2)


def stop(procs):
  """Kills and reaps every process in procs that is still running."""
  for p in procs:
    if p is not None and p.poll() is None:
      p.kill()
  for p in procs:
    if p is not None:
      p.wait(timeout=30)


@contextlib.contextmanager
def local_workers(log_dir, num_tasks=2, virtual_cpus=4):
  """Starts num_tasks workers on free loopback ports; yields (addresses, procs), a
  list the caller may change (e.g. restart a worker); kills them all on exit."""
  addresses = ["localhost:%d" % p for p in free_ports(num_tasks)]
  procs = []
  try:
    for t in range(num_tasks):
      procs.append(start_worker(addresses, t, virtual_cpus, log_dir))
    wait_listening(addresses, procs)
    yield addresses, procs
  finally:
    stop(procs)


@contextlib.contextmanager
def local_listener():
  """A loopback socket that accepts connections; yields its "localhost:port"."""
  s = socket.socket()
  try:
    s.bind(("localhost", 0))
    s.listen(8)
    yield "localhost:%d" % s.getsockname()[1]
  finally:
    s.close()


def run_script(args, timeout=240):
  """Runs `python args...` in the repository; returns the CompletedProcess."""
  return subprocess.run([sys.executable] + list(args), cwd=REPO_ROOT, env=env(),
                        capture_output=True, text=True, timeout=timeout, check=False)


def last_json_line(stdout):
  """The last line of stdout that is a JSON object, parsed."""
  for line in reversed(stdout.splitlines()):
    if line.startswith("{"):
      return json.loads(line)
  raise AssertionError("no JSON result in output:\n%s" % stdout[-3000:])
