"""What one collective between processes costs on this host: the floor under every
multi-process step (issue 34 item 2).

Starts --processes processes on loopback (each one virtual CPU, its thread pools sized to
its share of the host's cores, as a cluster process of the trainer's), and times in each,
alternating, tf.functions that differ only in their collectives between the processes:

- call: no collective (the baseline: a tf.function call of one small op);
- 1 reduce: one CollectiveReduceV2 (SUM) of --floats floats;
- 2 chained: two, the second reducing the first's result;
- 2 side by side: two independent ones in one call;
- compute: a chain of --matmuls 256x256 matmuls, no collective;
- compute + 1 reduce: the same chain beside one independent collective.

Prints ms per call and each row's extra milliseconds over its baseline (call, or
compute), task 0's timing; every process checks that its sums are right.

  python -m benchmarks.collective_latency [--processes 2 --floats 1 --calls 200]
"""
import json
import sys

from absl import app
from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_integer, "processes", 2, "Processes on loopback.")
common.define_flag(flags.DEFINE_integer, "floats", 1, "Floats each collective sums.")
common.define_flag(flags.DEFINE_integer, "calls", 200, "Calls per timed block.")
common.define_flag(flags.DEFINE_integer, "repeats", 3,
                   "Timed blocks (the median is reported).")
common.define_flag(flags.DEFINE_integer, "matmuls", 20,
                   "Matmuls of the compute rows (256x256).")
common.define_flag(flags.DEFINE_string, "cluster", None,
                   "Internal: the processes' addresses (run as one of them).")
common.define_flag(flags.DEFINE_integer, "task", None, "Internal: this process's task.")

GROUP_KEY = 77  # a group of its own: this benchmark runs no mesh


def _functions(device, processes, floats, matmuls):
  """{row: tf.function} as the module docstring lists them, and the expected sums."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  ones = tf.ones([floats])
  x = tf.random.stateless_normal([256, 256], seed=[1, 2]) * 0.05

  def reduce(value, instance):
    return tf.raw_ops.CollectiveReduceV2(
        input=value, group_size=processes, group_key=GROUP_KEY, instance_key=instance,
        ordering_token=[], merge_op="Add", final_op="Id")

  def chain():
    y = x
    for _ in range(matmuls):
      y = tf.matmul(y, x)
    return tf.reduce_sum(y)

  def on_device(fn):
    def run():
      with tf.device(device):
        return fn()
    return tf.function(run)

  fns = {
      "call": on_device(lambda: ones + 1.0),
      "1 reduce": on_device(lambda: reduce(ones, 1)),
      "2 chained": on_device(lambda: reduce(reduce(ones, 2), 3)),
      "2 side by side": on_device(lambda: reduce(ones, 4) + reduce(ones * 2.0, 5)),
      "compute": on_device(lambda: ones + chain()),
      "compute + 1 reduce": on_device(lambda: reduce(ones, 6) + chain() * 0.0),
  }
  n = float(processes)
  expected = {"call": 2.0, "1 reduce": n, "2 chained": n * n, "2 side by side": 3 * n,
              "compute + 1 reduce": n}
  return fns, expected


def run_task(cluster_arg, task):
  """One process: checks the sums, times the rows; task 0 prints one JSON line."""
  from mesh_tf import cpu_threads  # pylint: disable=g-import-not-at-top
  from mesh_tf.cluster import host_threads  # pylint: disable=g-import-not-at-top
  from mesh_tf.cluster import multi_client  # pylint: disable=g-import-not-at-top
  addresses = cluster_arg.split(",")
  # the process's share of the cores, unless the user sized the pools
  sizes = cpu_threads.apply(host_threads.share(addresses, task, "auto", cpu_devices=1))
  device = multi_client.enable_collectives(addresses, task, 1)[0]
  multi_client.wait_for_peers(addresses, task, timeout=120)
  fns, expected = _functions(device, len(addresses), FLAGS.floats, FLAGS.matmuls)
  for name, value in expected.items():
    got = fns[name]().numpy()
    if not (got == value).all():
      raise RuntimeError("%s summed to %s, expected %s" % (name, got[:4], value))
  seconds = common.time_alternating(fns, FLAGS.calls, FLAGS.repeats)
  # every task prints (run_together reads each); task 0's timing is the table's
  print(json.dumps({"seconds": seconds, "threads": list(sizes or ())}), flush=True)


def run_processes():
  """Starts the processes; returns task 0's results."""
  from mesh_tf.cluster import local  # pylint: disable=g-import-not-at-top
  cluster_arg = ",".join("localhost:%d" % p for p in local.free_ports(FLAGS.processes))
  shared = ["--floats=%d" % FLAGS.floats, "--calls=%d" % FLAGS.calls,
            "--repeats=%d" % FLAGS.repeats, "--matmuls=%d" % FLAGS.matmuls]
  return common.run_together(
      [[sys.executable, "-m", "benchmarks.collective_latency", "--cluster=" + cluster_arg,
        "--task=%d" % task] + shared for task in range(FLAGS.processes)],
      "collective_latency", timeout=600)[0]


def main(_):
  if FLAGS.cluster:
    run_task(FLAGS.cluster, FLAGS.task)
    return
  result = run_processes()
  seconds = result["seconds"]
  print(common.machine_line())
  pools = ("(intra, inter) = (%d, %d)" % tuple(result["threads"]) if result["threads"]
           else "as TF or the user sized them")
  print("%d processes on loopback, 1 virtual CPU each, thread pools %s; collectives of "
        "%d float(s); %d calls x %d repeats, median"
        % (FLAGS.processes, pools, FLAGS.floats, FLAGS.calls, FLAGS.repeats))
  rows = [["row", "ms/call", "extra ms", "over"]]
  for name, s in seconds.items():
    base = "compute" if name.startswith("compute") else "call"
    rows.append([name, "%.3f" % (1e3 * s),
                 "" if name == base else "%.3f" % (1e3 * (s - seconds[base])),
                 "" if name == base else base])
  common.print_table(rows)


if __name__ == "__main__":
  app.run(main)
