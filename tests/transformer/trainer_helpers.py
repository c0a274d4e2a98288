"""Shared set-up of the trainer tests: a tiny LM in gin, a text corpus, subprocess runs."""
import os
import subprocess
import sys

import gin

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_WORDS = ("the cat sat on the mat and the dog ran to the red barn while a bird sang "
          "over the green hill near the old mill by the river")


def write_corpus(directory, name="corpus.txt", repeats=60):
  """A repetitive (so quickly learnable) text file; returns its path."""
  path = os.path.join(str(directory), name)
  with open(path, "w") as f:
    for i in range(repeats):
      f.write("%s %d\n" % (_WORDS, i % 7))
  return path


def tiny_lm_bindings(model_dir, corpus, train_steps=6, save_every=2, keep=2,
                     log_every=2, peak_flops=3e10):
  """gin bindings of a 1-layer d_model=16 LM on corpus, batch 8 x length 16.

  peak_flops binds step_metrics.peak_flops_per_second (about this host's rate), so that
  each trainer process skips the ~1 CPU-second matmul calibration of its MFU line; None
  leaves it unbound (test_step_metrics checks the calibration that way).
  """
  peak = [] if peak_flops is None else [
      "step_metrics.peak_flops_per_second = %g" % peak_flops]
  return peak + [
      "num_layers = 1", "d_model = 16", "d_ff = 32", "num_heads = 4", "d_kv = 4",
      "dropout_rate = 0.0",
      "Unitransformer.max_length = 16",
      "utils.run.model_dir = %r" % str(model_dir),
      "utils.run.sequence_length = 16",
      "utils.run.batch_size = ('sequences_per_batch', 8)",
      "utils.run.train_steps = %d" % train_steps,
      "utils.run.save_checkpoints_steps = %d" % save_every,
      "utils.run.keep_checkpoint_max = %d" % keep,
      "utils.run.iterations_per_loop = %d" % log_every,
      "utils.run.learning_rate_schedule = 0.01",
      "utils.run.perplexity_eval_steps = 2",
      "utils.run.train_dataset_fn = @dataset.text_corpus_dataset",
      "utils.run.eval_dataset_fn = @dataset.text_corpus_dataset",
      "text_corpus_dataset.glob = %r" % str(corpus),
      "text_corpus_dataset.validation_fraction = 0.3",
  ]


def main_command(params, mode=None):
  """argv running models.transformer.main with these gin params."""
  cmd = [sys.executable, "-m", "models.transformer.main"]
  cmd += ["--gin_param=%s" % p for p in params]
  if mode:
    cmd.append("--mode=%s" % mode)
  return cmd


def main_env():
  """The environment trainer subprocesses run in: this test process's, whose PYTHONPATH
  tests/conftest.py's lean_subprocesses starts with this repository."""
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def run_main(params, mode=None, timeout=240):
  """Runs the trainer in a subprocess; returns the CompletedProcess (text output)."""
  return subprocess.run(main_command(params, mode), cwd=REPO_ROOT, env=main_env(),
                        capture_output=True, text=True, timeout=timeout, check=False)


def start_main(params, mode=None, **popen_kwargs):
  """Starts the trainer in a subprocess; returns its Popen (the caller ends it)."""
  return subprocess.Popen(main_command(params, mode), cwd=REPO_ROOT, env=main_env(),
                          **popen_kwargs)


def run_with(params, **kwargs):
  """utils.run in this process under exactly these gin params (plus defaults.gin)."""
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    gin_setup.parse_gin([], params)
    return utils.run(**kwargs)
  finally:
    gin.clear_config()


def run_python_without_mesh_tf(script, *args, cwd=None):
  """Runs `python -c script args` with no PYTHONPATH (so mesh_tf cannot be imported
  from the repository); returns the CompletedProcess, asserting it succeeded."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("PYTHONPATH", None)
  result = subprocess.run([sys.executable, "-c", script] + list(args), cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result
