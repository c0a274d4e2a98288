"""A worker process of a cluster: a TensorFlow gRPC server that clients place ops on.

Start one per task (one per host, or several on one host on different ports):

    python -m mesh_tf.cluster.worker --cluster=host0:2222,host1:2222 --task=0 \\
        --virtual_cpus=4

--virtual_cpus splits the host CPU into that many devices (one per mesh processor the
task holds); GPUs are found as usual. Without --cluster the worker reads TF_CONFIG.
The process serves until it is killed.
"""
import os
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("cluster", None, "Comma-separated worker addresses host:port "
                    "(default: TF_CONFIG).")
flags.DEFINE_integer("task", None, "This worker's index in --cluster (default: "
                     "TF_CONFIG's task index).")
flags.DEFINE_integer("virtual_cpus", 1, "CPU devices this worker offers.")
flags.DEFINE_string("threads", "auto", "Cores this worker's TensorFlow thread pools "
                    "are sized for: 'auto' (this host's cores shared among the "
                    "--cluster workers on it), a number, or 0 (TensorFlow's own).")


def main(argv):
  del argv
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from mesh_tf.cluster import server as server_lib  # pylint: disable=g-import-not-at-top
  from mesh_tf.cluster import host_threads, spec  # pylint: disable=g-import-not-at-top
  try:
    if FLAGS.cluster:
      addresses, task = spec.parse_addresses(FLAGS.cluster), FLAGS.task
    else:
      found = spec.from_tf_config()
      if found is None:
        raise spec.ClusterError("give --cluster=host:port,... (or set TF_CONFIG)")
      addresses, task_type, index = found
      if task_type != spec.JOB and FLAGS.task is None:
        raise spec.ClusterError("TF_CONFIG names a %r task; a worker needs type %r "
                                "(or --task=N)" % (task_type, spec.JOB))
      task = index if FLAGS.task is None else FLAGS.task
    if task is None:
      raise spec.ClusterError("give --task=N, this worker's index in --cluster")
    server_lib.serve(addresses, task, FLAGS.virtual_cpus,
                     host_threads.from_flag(FLAGS.threads))
  except ValueError as e:
    sys.stderr.write("error: %s\n" % e)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
