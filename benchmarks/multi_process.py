"""A Transformer LM on mesh batch:2;model:4 (or --mesh) spread over processes on this
host (loopback gRPC): 1 process x 8 devices vs 2 x 4 vs 4 x 2, in these modes:

- local: one process, no cluster, the mesh over its 8 virtual CPUs (the baseline:
  what leaving one process is compared with);
- placement (single client): workers (mesh_tf.cluster.worker) hold the devices, one
  client process (this script with --client) connects, trains and reports;
- spmd (multi client): every process (this script with --spmd_task) runs its own
  devices (mesh_tf.cluster.multi_client) as ONE placement program (each process's
  devices are a block of the mesh in every configuration here); they meet in TF
  collective ops; each reads only its share of the batch; task 0 reports;
- spmd_per_device: spmd with one replica per device in every configuration.

Prints the median step time (and its ratio to the first row), the CPU time per step of
all the row's processes (placement: the client and its workers), the bytes per step
that cross a process boundary (communication accounting), and the losses (which must
agree).

  python -m benchmarks.multi_process [--steps 10 --repeats 5 --size small|peer]
      [--mesh batch:8 --layout batch:batch]
      [--modes local,placement,spmd] [--configs 1x8,2x4,4x2] [--threads auto,0]

Each cluster process sizes its TensorFlow thread pools to its share of this host's
cores (`--threads=auto`, mesh_tf.cluster.host_threads); `--threads=auto,0` adds rows
with TensorFlow's own sizing (every process as many threads as the host has cores).

All processes of a configuration are killed before the next one starts. In placement
mode the client is a separate process in every configuration, so 1 x 8 pays the same
client-worker hop as the others.
"""
import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_integer, "steps", 10, "Train steps per timed block.")
common.define_flag(flags.DEFINE_integer, "repeats", 5,
                   "Timed blocks (the median is reported).")
common.define_flag(flags.DEFINE_string, "size", "small",
                   "Model size: tiny (for smoke tests), small, or peer "
                   "(the LM of benchmarks.step_time).")
common.define_flag(flags.DEFINE_list, "configs", ["1x8", "2x4", "4x2"],
                   "processes x devices per process.")
common.define_flag(flags.DEFINE_list, "modes", ["local", "placement", "spmd"],
                   "Modes to measure: local (one process, no cluster: the baseline), "
                   "placement, spmd, spmd_per_device.")
common.define_flag(flags.DEFINE_bool, "local", False,
                   "Internal: run the one-process baseline.")
common.define_flag(flags.DEFINE_string, "client", None,
                   "Internal: run as the client of this cluster.")
common.define_flag(flags.DEFINE_list, "worker_pids", [],
                   "Internal: the client's workers on this host, whose CPU it reads.")
common.define_flag(flags.DEFINE_string, "spmd_cluster", None,
                   "Internal: the processes of an spmd run.")
common.define_flag(flags.DEFINE_integer, "spmd_task", None,
                   "Internal: this process's task in --spmd_cluster.")
common.define_flag(flags.DEFINE_string, "spmd_program", "auto",
                   "Internal: the ReplicaSet program of an spmd run.")
common.define_flag(flags.DEFINE_list, "threads", ["auto"],
                   "Thread pool sizes to measure, one row each: auto (each process's "
                   "share of this host's cores, mesh_tf.cluster.host_threads and "
                   "cpu_threads), a number of cores (cluster rows), 0 (TF's own).")
common.define_flag(flags.DEFINE_string, "process_threads", "auto",
                   "Internal: the thread pool size of this cluster process.")

MESH = "batch:2;model:4"
LAYOUT = "batch:batch;d_ff:model;heads:model;vocab:model"
common.define_flag(flags.DEFINE_string, "mesh", MESH,
                   "Mesh shape (8 processors), e.g. batch:8 for pure data parallelism.")
common.define_flag(flags.DEFINE_string, "layout", LAYOUT, "Layout rules.")


def _shared_args():
  """The flags every subprocess of a configuration is given."""
  return ["--size=" + FLAGS.size, "--steps=%d" % FLAGS.steps,
          "--repeats=%d" % FLAGS.repeats, "--mesh=" + FLAGS.mesh,
          "--layout=" + FLAGS.layout]


def _cpu_seconds(pid):
  """CPU seconds (all threads) process pid has used, from /proc (Linux)."""
  with open("/proc/%d/stat" % pid) as f:
    fields = f.read().rpartition(")")[2].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(step, pids=()):
  """(median seconds per step, [CPU seconds per step of this process, then of each
  process in pids (other processes of this host)]) of step() timed by
  common.time_alternating; CPU time counts every thread."""
  before = [time.process_time()] + [_cpu_seconds(p) for p in pids]
  seconds = common.time_alternating({"step": step}, FLAGS.steps, FLAGS.repeats)["step"]
  after = [time.process_time()] + [_cpu_seconds(p) for p in pids]
  calls = FLAGS.steps * FLAGS.repeats + 1  # time_alternating's warm-up call included
  return seconds, [(a - b) / calls for a, b in zip(after, before)]


def run_client(cluster_arg):
  """Connects, times the train step, and prints one JSON line of results."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tf import cluster  # pylint: disable=g-import-not-at-top
  from mesh_tf.analysis import communication  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  devices = cluster.connect(cluster_arg, FLAGS.mesh)
  c = config.TinyLmConfig(**dict(common.LM_SIZES[FLAGS.size], heads=8))
  batch = config.synthetic_batch(c)
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  tf.random.set_seed(0)
  model = mtf_model.TinyLmModel(c)
  impl = mtf.PlacementMeshImpl(FLAGS.mesh, FLAGS.layout, devices)
  step = model.make_train_step(impl)
  losses = [float(step(inputs, targets)) for _ in range(2)]  # traces once, records
  crossing = communication.bytes_crossing_processes(
      impl.comm_log, FLAGS.mesh, cluster.processes_of_devices(devices))
  seconds, cpu = _timed(lambda: step(inputs, targets),
                        [int(p) for p in FLAGS.worker_pids])
  print(json.dumps({"seconds": seconds, "losses": losses, "cpu": cpu,
                    "crossing": [crossing[t] for t in sorted(crossing)]}))


def run_local():
  """One process, no cluster: the mesh over 8 virtual CPUs of this process (the
  baseline every other row is a ratio to); prints one JSON line."""
  common.set_up_virtual_cpus(8, size_thread_pools=FLAGS.process_threads != "0")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig(**dict(common.LM_SIZES[FLAGS.size], heads=8))
  batch = config.synthetic_batch(c)
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  tf.random.set_seed(0)
  model = mtf_model.TinyLmModel(c)
  impl = mtf.PlacementMeshImpl(FLAGS.mesh, FLAGS.layout, ["/cpu:%d" % i for i in range(8)])
  step = model.make_train_step(impl)
  losses = [float(step(inputs, targets)) for _ in range(2)]
  seconds, cpu = _timed(lambda: step(inputs, targets))
  print(json.dumps({"seconds": seconds, "losses": losses, "cpu": cpu, "crossing": [0]}))


def run_local_config(processes, per_process, threads):
  """The one-process baseline, in a fresh process like every other row (threads "0":
  TF's own pool sizes instead of mesh_tf.cpu_threads's)."""
  del processes, per_process
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = common.subprocess_env()
  out = subprocess.run(
      [sys.executable, "-m", "benchmarks.multi_process", "--local",
       "--process_threads=" + threads] + _shared_args(),
      cwd=root, env=env,
      capture_output=True, text=True, timeout=900, check=False)
  if out.returncode:
    raise RuntimeError("one-process run failed:\n%s" % out.stderr[-3000:])
  return common.last_json(out.stdout)


def run_spmd_task(cluster_arg, task):
  """One process of an spmd run: trains with the others; task 0 prints one JSON line."""
  from mesh_tf.cluster import host_threads, multi_client  # pylint: disable=g-import-not-at-top
  replicas = multi_client.ReplicaSet(FLAGS.mesh, FLAGS.layout, cluster_arg, task,
                                     program=FLAGS.spmd_program,
                                     threads=host_threads.from_flag(
                                         FLAGS.process_threads))
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tf.analysis import communication  # pylint: disable=g-import-not-at-top
  from mesh_tf.cluster import input_share, spmd_training  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig(**dict(common.LM_SIZES[FLAGS.size], heads=8))
  begin, end = input_share.batch_rows(replicas.impls[0],
                                      "batch:%d;length:%d" % (c.batch, c.length))
  batch = config.synthetic_batch(c)[begin:end]  # this process's rows only
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  tf.random.set_seed(0)
  trainer = spmd_training.SpmdTrainer(mtf_model.TinyLmModel(c), replicas)
  losses = [trainer.step(inputs, targets) for _ in range(2)]
  k = len(replicas.pnums)
  crossing = communication.bytes_crossing_processes(
      replicas.impls[0].comm_log, FLAGS.mesh, [p // k for p in range(k * len(
          replicas.addresses))])
  seconds, cpu = _timed(lambda: tf.constant(trainer.step(inputs, targets)))
  # every task prints its CPU; task 0 the rest
  print(json.dumps({"cpu": cpu} if not replicas.is_chief else {
      "seconds": seconds, "losses": losses, "cpu": cpu,
      "crossing": [crossing[t] for t in sorted(crossing)]}), flush=True)


def run_spmd_config(processes, per_process, threads, program="auto"):
  """Starts the processes of one spmd configuration; returns task 0's results, with the
  CPU time of every task."""
  from mesh_tf.cluster import local  # pylint: disable=g-import-not-at-top
  del per_process  # each process takes mesh size / processes devices
  cluster_arg = ",".join("localhost:%d" % p for p in local.free_ports(processes))
  results = common.run_together(
      [[sys.executable, "-m", "benchmarks.multi_process", "--spmd_cluster=" + cluster_arg,
        "--spmd_task=%d" % task, "--spmd_program=" + program,
        "--process_threads=" + threads] + _shared_args() for task in range(processes)],
      "spmd %dx%d" % (processes, 8 // processes))
  return dict(results[0], cpu=[c for r in results for c in r["cpu"]])


def run_config(processes, per_process, threads):
  """Starts the workers and a client for one configuration; returns its results."""
  from mesh_tf.cluster import local  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = common.subprocess_env()
  with local.local_workers(processes, per_process, env=env, cwd=root,
                           threads=threads) as (addresses, workers):
    client = subprocess.run(
        [sys.executable, "-m", "benchmarks.multi_process",
         "--client=" + ",".join(addresses),
         "--worker_pids=" + ",".join(str(w.pid) for w in workers)] + _shared_args(),
        cwd=root, env=env,
        capture_output=True, text=True, timeout=900, check=False)
  if client.returncode:
    raise RuntimeError("client of %dx%d failed:\n%s"
                       % (processes, per_process, client.stderr[-3000:]))
  return common.last_json(client.stdout)


def main(_):
  if FLAGS.client:
    run_client(FLAGS.client)
    return
  if FLAGS.spmd_cluster:
    run_spmd_task(FLAGS.spmd_cluster, FLAGS.spmd_task)
    return
  if FLAGS.local:
    run_local()
    return
  runners = {"local": run_local_config, "placement": run_config, "spmd": run_spmd_config,
             "spmd_per_device": lambda p, k, t: run_spmd_config(p, k, t, "per_device")}
  results = {}
  for mode in FLAGS.modes:
    for name in (["1x8"] if mode == "local" else FLAGS.configs):
      processes, per_process = (int(s) for s in name.split("x"))
      for threads in FLAGS.threads:
        row = "%s %s" % (mode, name)
        if len(FLAGS.threads) > 1:
          row += " threads=%s" % threads
        results[row] = runners[mode](processes, per_process, threads)
  first = next(iter(results))
  base = results[first]
  print(common.machine_line())
  print("LM %s on mesh %s, layout %s; %d steps x %d repeats, median per step"
        % (dict(common.LM_SIZES[FLAGS.size], heads=8), FLAGS.mesh, FLAGS.layout, FLAGS.steps,
           FLAGS.repeats))
  rows = [["mode processes x devices", "ms/step", "vs %s" % first, "CPU ms/step",
           "cross-process B/step", "max B/process", "loss after 2 steps"]]
  for name, r in results.items():
    rows.append([name, "%.1f" % (1e3 * r["seconds"]),
                 "%.2f" % (r["seconds"] / base["seconds"]),
                 "%.1f" % (1e3 * sum(r["cpu"])),
                 "%.0f" % sum(r["crossing"]), "%.0f" % max(r["crossing"]),
                 "%.6f" % r["losses"][-1]])
  common.print_table(rows)
  print("CPU ms/step: the CPU time of every process of the row (all threads; placement: "
        "the client and its workers) over its timed steps.")
  print("cross-process bytes: communication.bytes_crossing_processes of the collectives "
        "the backend emitted (placement: the client's ring copies; spmd: one program's "
        "TF collective ops, every program emits the same), with processors laid "
        "task-major over the processes.")


if __name__ == "__main__":
  app.run(main)
