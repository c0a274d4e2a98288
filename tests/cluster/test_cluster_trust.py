"""What the docs say about who can reach a cluster port stays true: TF's server
listens on every address of the host whatever the cluster entry names, and each
start-up line says so."""
import os
import subprocess
import sys
import time

import cluster_helpers


def listening_addresses(port):
  """The local addresses (hex, as /proc/net/tcp* writes them) listening on port."""
  found = []
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    if not os.path.exists(table):
      continue
    with open(table) as f:
      for line in f.readlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.rsplit(":", 1)
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
          found.append(address)
  return found


def test_a_loopback_worker_listens_on_every_address_and_says_so(tmp_path):
  port = cluster_helpers.free_ports(1)[0]
  log = open(tmp_path / "worker.txt", "w")
  proc = subprocess.Popen(
      [sys.executable, "-m", "mesh_tf.cluster.worker", "--cluster=localhost:%d" % port,
       "--task=0", "--virtual_cpus=1"], cwd=cluster_helpers.REPO_ROOT,
      env=cluster_helpers.env(), stdout=log, stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 120
    while "serving" not in (tmp_path / "worker.txt").read_text():
      assert proc.poll() is None and time.time() < deadline, (
          tmp_path / "worker.txt").read_text()
      time.sleep(0.2)
    bound = listening_addresses(port)
  finally:
    proc.kill()
    proc.wait()
    log.close()
  text = (tmp_path / "worker.txt").read_text()
  # all zeros: the wildcard address, not 127.0.0.1 (0100007F) that the entry names
  assert bound and all(set(a) == {"0"} for a in bound), bound
  assert ("port %d listens on every address of this host and runs any graph sent to "
          "it (no authentication" % port) in text, text
  docs = open(os.path.join(cluster_helpers.REPO_ROOT, "docs", "multi_host.md")).read()
  assert "listens on every address of the host" in docs
