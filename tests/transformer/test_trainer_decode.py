"""Decode and export modes end to end on a trained tiny LM (uses decoding.py)."""
import os
import subprocess
import sys

import gin

import trainer_helpers
from models.transformer import gin_setup
from models.transformer import utils


def _run(params, **kwargs):
  gin.clear_config()
  try:
    gin_setup.parse_gin([], params)
    return utils.run(**kwargs)
  finally:
    gin.clear_config()


def test_decode_and_export_of_a_trained_lm(tmp_path, capsys):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "m"
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=2)
  _run(params)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("the cat\nthe dog ran\n\nover\n")
  output = tmp_path / "decoded.txt"
  lines = _run(params + ["utils.run.decode_input_file = %r" % str(prompts),
                         "utils.run.decode_output_file = %r" % str(output)],
               mode="decode")
  assert len(lines) == 4
  assert output.read_text().count("\n") == 4
  assert "'the cat' -> " in capsys.readouterr().out

  export_path = str(tmp_path / "export")
  _run(params + ["utils.run.export_path = %r" % export_path], mode="export")
  loader = ("import sys, tensorflow as tf\n"
            "m = tf.saved_model.load(sys.argv[1])\n"
            "ids = m.signatures['serving_default'](tf.constant([[119, 107, 104]]))\n"
            "txt = m.signatures['text'](tf.constant(['the cat']))\n"
            "assert 'mesh_tf' not in sys.modules\n"
            "print(ids['outputs'].shape, txt['outputs'].shape)\n")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("PYTHONPATH", None)
  result = subprocess.run([sys.executable, "-c", loader, export_path], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == "(1, 16) (1,)"
