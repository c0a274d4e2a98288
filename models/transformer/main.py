"""The Transformer trainer's command line (the original's transformer/main.py).

    python -m models.transformer.main --model_dir=/tmp/lm \\
        --gin_file=models/lm_tiny.gin --gin_param="utils.run.train_steps = 100" \\
        --mode=train          # or eval, decode, export

gin files are looked up as given, then under each --gin_location_prefix (default: the
repository's gin_configs/); gin_configs/defaults.gin is parsed first when present. The
mesh shape, layout, backend, model, data and schedule all come from gin.

Across processes (docs/multi_host.md): --cluster=h0:2222,h1:2222 (or TF_CONFIG) makes
this process the chief of that cluster's workers; a TF_CONFIG task of type "worker"
makes it serve as that worker.
"""
import os
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where checkpoints, summaries and results go "
                    "(sets utils.run.model_dir).")
flags.DEFINE_multi_string("gin_file", [], "Gin files to parse, in order.")
flags.DEFINE_multi_string("gin_param", [], "Gin bindings, e.g. "
                          "\"utils.run.train_steps = 100\".")
flags.DEFINE_multi_string("gin_location_prefix", [], "Directories to find gin files in "
                          "(default: the repository's gin_configs/).")
flags.DEFINE_enum("mode", None, ["train", "eval", "perplexity_eval", "decode", "export"],
                  "Overrides utils.run.mode.")
flags.DEFINE_string("cluster", None, "Worker addresses host:port,... to lay the mesh "
                    "over (default: TF_CONFIG, else this process alone).")


def _gin_binds(name):
  import gin  # pylint: disable=g-import-not-at-top
  try:
    gin.query_parameter(name)
    return True
  except ValueError:
    return False


def _run_chief():
  """utils.run (this process trains), once a model directory is known."""
  from mesh_tf.errors import MtfError  # pylint: disable=g-import-not-at-top
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  if not FLAGS.model_dir and not _gin_binds("utils.run.model_dir"):
    raise MtfError("no model directory: pass --model_dir=DIR (or bind "
                   "utils.run.model_dir in gin)")
  return utils.run()


def main(_):
  """Parses gin and flags, then calls utils.run; bad input exits 1 with its message."""
  del _
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from mesh_tf.errors import MtfError  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  params = list(FLAGS.gin_param)
  if FLAGS.model_dir:
    params.append("utils.run.model_dir = %r" % FLAGS.model_dir)
  if FLAGS.mode:
    params.append("utils.run.mode = %r" % FLAGS.mode)
  from models.transformer.trainer import cluster_setup  # pylint: disable=g-import-not-at-top
  try:
    gin_setup.parse_gin(FLAGS.gin_file, params, FLAGS.gin_location_prefix or None)
    cluster_setup.run_in_role(FLAGS.cluster, _run_chief)
  except MtfError as e:
    sys.stderr.write("error: %s\n" % e)
    sys.exit(1)
  except KeyboardInterrupt:
    sys.stderr.write("interrupted\n")
    sys.exit(130)


if __name__ == "__main__":
  app.run(main)
