"""Worker processes on this host, on free loopback ports (for tests, benchmarks and
trying a cluster out on one machine). Every started process is killed on exit."""
import contextlib
import os
import socket
import subprocess
import sys
import time

from mesh_tf.cluster import faults

STARTUP_TIMEOUT = 90  # seconds for a worker to import TF and listen, on a loaded host


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


def start_worker(addresses, task, virtual_cpus, log_dir=None, env=None, cwd=None,
                 threads="auto"):
  """Popen of `python -m mesh_tf.cluster.worker` for task (output appended to
  log_dir/worker<task>.txt, or discarded); threads is its --threads."""
  log = subprocess.DEVNULL
  if log_dir is not None:
    log = open(os.path.join(str(log_dir), "worker%d.txt" % task), "a")
  try:
    return subprocess.Popen(
        [sys.executable, "-m", "mesh_tf.cluster.worker",
         "--cluster=" + ",".join(addresses), "--task=%d" % task,
         "--virtual_cpus=%d" % virtual_cpus, "--threads=%s" % threads],
        cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
  finally:
    if log is not subprocess.DEVNULL:
      log.close()  # the child holds its own copy


def wait_listening(addresses, procs, timeout=STARTUP_TIMEOUT):
  """Returns once every worker accepts connections; raises RuntimeError if one exits
  or they are not all listening within timeout seconds."""
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
def local_workers(num_tasks, virtual_cpus, log_dir=None, env=None, cwd=None,
                  threads="auto"):
  """Starts num_tasks workers on free loopback ports, each with --threads=threads;
  yields (addresses, procs), a list the caller may change (e.g. restart a worker);
  kills them all on exit."""
  addresses = ["localhost:%d" % p for p in free_ports(num_tasks)]
  procs = []
  try:
    for t in range(num_tasks):
      procs.append(start_worker(addresses, t, virtual_cpus, log_dir, env, cwd, threads))
    wait_listening(addresses, procs)
    yield addresses, procs
  finally:
    stop(procs)
