"""SPMD peers over loopback: a flat thread count over 450 steps, and a lost
peer (stopped, never started, port taken) named in one line. (A killed peer:
test_spmd_exact_resume.py, on its resumed run.)"""
import re
import signal
import socket
import time

import lm_cluster_helpers as helpers

MESH = "utils.run.mesh_shape = 'batch:2'"  # one replica per process: cheap to trace
TIMEOUT = "cluster_setup.cluster_config.collective_timeout = 5"


def threads_of(pid):
  """The OS thread count of process pid (None once it has ended)."""
  try:
    with open("/proc/%d/status" % pid) as f:
      return next(int(l.split()[1]) for l in f if l.startswith("Threads:"))
  except (OSError, StopIteration):
    return None


def params(tmp_path, steps, log_every):
  corpus = helpers.trainer_helpers.write_corpus(tmp_path)
  return helpers.lm_params(tmp_path / "model", corpus, train_steps=steps,
                           save_every=steps) + [
                               MESH, TIMEOUT, "utils.run.eval_steps = 0",
                               "utils.run.iterations_per_loop = %d" % log_every]


def test_threads_stay_flat_over_450_steps_then_a_stopped_peer_is_named_within_the_timeout(
    tmp_path):
  # Each collective used to keep a thread asleep for its whole timeout: ~45 more
  # threads per step, thousands within seconds. Threads counted from step <= 90 to
  # step >= 450 show any per-step growth at a fraction of a long run's cost; then the
  # same run checks what SIGSTOP to task 1 does to task 0.
  samples = {}  # step -> [threads of task 0, of task 1]
  with helpers.spmd_peers(params(tmp_path, 100000, 30), tmp_path) as procs:
    deadline = time.time() + 400
    log = tmp_path / "peer0.txt"
    counted = {}
    while not counted or max(counted) < 450:
      assert all(p.poll() is None for p in procs), log.read_text()[-3000:]
      assert time.time() < deadline, sorted(samples)
      steps = re.findall(r"step (\d+)/100000", log.read_text())
      if steps:
        samples.setdefault(int(steps[-1]), [threads_of(p.pid) for p in procs])
      counted = {s: c for s, c in samples.items() if None not in c}
      time.sleep(0.2)
    began = time.time()
    procs[1].send_signal(signal.SIGSTOP)
    code = procs[0].wait(timeout=90)
    took = time.time() - began
    procs[1].kill()
  out = helpers.peer_logs(tmp_path)[0]
  assert min(counted) <= 90 and max(counted) >= 450, sorted(counted)
  first, last = counted[min(counted)], counted[max(counted)]
  for task in (0, 1):
    assert last[task] - first[task] < 40, sorted(counted.items())
  assert code == 1, out[-3000:]
  errors = [l for l in out.splitlines() if l.startswith("error:")]
  assert len(errors) == 1, out[-3000:]
  assert re.match(r"error: lost worker task 1 \(localhost:\d+\): it did not answer a "
                  r"health check within 5 s", errors[0]), errors
  assert took < 5 + 60, took  # noticed by the monitor, not the 120 s join margin


def test_a_peer_that_never_starts_is_named(tmp_path, monkeypatch):
  """Only task 0 runs: it names task 1 and its address after the startup timeout."""
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  ports = helpers.cluster_helpers.free_ports(2)
  addresses = ["localhost:%d" % p for p in ports]
  config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 0}}
  cmd = helpers.peer_command(params(tmp_path, 10, 5) + [
      "cluster_setup.cluster_config.startup_timeout = 3"])
  out = subprocess.run(cmd, cwd=helpers.cluster_helpers.REPO_ROOT, timeout=120,
                       env=dict(helpers.cluster_helpers.env(), TF_CONFIG=json.dumps(config)),
                       capture_output=True, text=True)
  assert out.returncode == 1, out.stderr[-3000:]
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1, out.stderr[-3000:]
  assert errors[0].startswith("error: task 1 (%s) did not answer within 3 s"
                              % addresses[1]), errors


def test_a_port_in_use_is_named(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  taken = socket.socket()
  taken.bind(("", 0))
  taken.listen(1)
  try:
    port = taken.getsockname()[1]
    addresses = ["localhost:%d" % port,
                 "localhost:%d" % helpers.cluster_helpers.free_ports(1)[0]]
    config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 0}}
    out = subprocess.run(helpers.peer_command(params(tmp_path, 10, 5)),
                         cwd=helpers.cluster_helpers.REPO_ROOT, timeout=120,
                         env=dict(helpers.cluster_helpers.env(),
                                  TF_CONFIG=json.dumps(config)),
                         capture_output=True, text=True)
  finally:
    taken.close()
  assert out.returncode == 1, out.stderr[-3000:]
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1, out.stderr[-3000:]
  assert errors[0].startswith("error: task 0 cannot listen on its address localhost:%d"
                              % port), errors


def _run_pair(tmp_path, params_of_task, timeout=240):
  """Runs task 0 and task 1 with their own gin params; returns (codes, outputs)."""
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  addresses = ["localhost:%d" % p for p in helpers.cluster_helpers.free_ports(2)]
  procs, logs = [], []
  try:
    for task in (0, 1):
      config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": task}}
      logs.append(open(tmp_path / ("pair%d.txt" % task), "w"))
      procs.append(subprocess.Popen(
          helpers.peer_command(params_of_task[task]), cwd=helpers.cluster_helpers.REPO_ROOT,
          env=dict(helpers.cluster_helpers.env(), TF_CONFIG=json.dumps(config)),
          stdout=logs[-1], stderr=subprocess.STDOUT))
    codes = helpers.wait_all(procs, timeout)
  finally:
    helpers.cluster_helpers.stop(procs)
    for log in logs:
      log.close()
  return codes, [(tmp_path / ("pair%d.txt" % t)).read_text() for t in (0, 1)]


def _error_lines(out):
  return [l for l in out.splitlines() if l.startswith("error:")]


def test_processes_that_disagree_stop_before_step_1_naming_the_setting(tmp_path):
  base = params(tmp_path, 4, 1)
  other = base + ["utils.run.learning_rate_schedule = 0.02"]
  codes, outs = _run_pair(tmp_path, [base, other])
  assert codes == [1, 1], outs
  lines = [_error_lines(o) for o in outs]
  assert lines[0] == lines[1] and len(lines[0]) == 1, outs
  assert re.match(r"error: task 1 \(localhost:\d+\) disagrees with the chief, task 0 "
                  r"\(localhost:\d+\), on gin (utils\.)?run.learning_rate_schedule: "
                  r"the chief has 0.01, task 1 has 0.02", lines[0][0]), lines
  assert not any("step 1/" in o for o in outs), outs


def test_processes_that_see_different_checkpoints_stop(tmp_path):
  base = params(tmp_path, 2, 1)
  # model_dir now holds model.ckpt-2 (trained here in one process: checkpoints do not
  # depend on the layout, and two more peers would only cost time).
  helpers.run_here(base)
  empty = base + ["utils.run.model_dir = %r" % str(tmp_path / "typo")]
  resumed = [p for p in base if "train_steps" not in p] + ["utils.run.train_steps = 4"]
  empty = [p for p in empty if "train_steps" not in p] + ["utils.run.train_steps = 4"]
  codes, outs = _run_pair(tmp_path, [resumed, empty])
  assert codes == [1, 1], outs
  lines = [_error_lines(o) for o in outs]
  assert lines[0] == lines[1] and len(lines[0]) == 1, outs
  assert ("on checkpoint to resume from: the chief has model.ckpt-2, task 1 has none"
          in lines[0][0]), lines


def test_a_peer_without_the_spmd_setting_is_named(tmp_path):
  """Task 1 runs without cluster_config.mode = 'spmd': it serves as a placement
  worker, answers health checks, and never joins; task 0 names it."""
  base = params(tmp_path, 4, 1) + ["cluster_setup.cluster_config.startup_timeout = 8"]
  placement = [p for p in base if "mode = 'spmd'" not in p]
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  addresses = ["localhost:%d" % p for p in helpers.cluster_helpers.free_ports(2)]
  procs = []
  try:
    for task, argv in ((1, [a for a in helpers.peer_command(placement)
                             if "mode = 'spmd'" not in a]),
                       (0, helpers.peer_command(base))):
      config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": task}}
      procs.append(subprocess.Popen(
          argv, cwd=helpers.cluster_helpers.REPO_ROOT, text=True,
          env=dict(helpers.cluster_helpers.env(), TF_CONFIG=json.dumps(config)),
          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    out = procs[1].communicate(timeout=180)[0]
  finally:
    helpers.cluster_helpers.stop(procs)
  assert procs[1].returncode == 1, out[-3000:]
  errors = _error_lines(out)
  assert len(errors) == 1, out[-3000:]
  assert errors[0].startswith(
      "error: task 0: the processes did not agree on the run within 8 s although every "
      "peer answers; a peer (task 1 (%s)) is not running this SPMD program" % addresses[1]
  ), errors
