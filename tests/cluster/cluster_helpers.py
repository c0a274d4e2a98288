"""Local clusters for tests: worker processes on free loopback ports, always killed."""
import contextlib
import json
import os
import socket
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "transformer"))

import trainer_helpers  # pylint: disable=g-import-not-at-top,wrong-import-position
from mesh_tf.cluster import local  # pylint: disable=g-import-not-at-top,wrong-import-position

free_ports = local.free_ports
wait_listening = local.wait_listening
stop = local.stop


def env():
  """The environment subprocesses run in (see trainer_helpers.main_env)."""
  return trainer_helpers.main_env()


def start_worker(addresses, task, virtual_cpus, log_dir):
  """Starts worker `task` of addresses in this repository (see mesh_tf.cluster.local)."""
  return local.start_worker(addresses, task, virtual_cpus, log_dir, env(), REPO_ROOT)


def local_workers(log_dir, num_tasks=2, virtual_cpus=4):
  """Context manager: num_tasks local workers; yields (addresses, procs)."""
  return local.local_workers(num_tasks, virtual_cpus, log_dir, env(), REPO_ROOT)


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
