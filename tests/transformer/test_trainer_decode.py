"""Decode and export modes end to end on a trained tiny LM (uses decoding.py)."""
import trainer_helpers
from trainer_helpers import run_with


def test_decode_and_export_of_a_trained_lm(tmp_path, capsys):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "m"
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=2)
  run_with(params)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("the cat\nthe dog ran\n\nover\n")
  output = tmp_path / "decoded.txt"
  lines = run_with(params + ["utils.run.decode_input_file = %r" % str(prompts),
                         "utils.run.decode_output_file = %r" % str(output)],
               mode="decode")
  assert len(lines) == 4
  assert output.read_text().count("\n") == 4
  assert "'the cat' -> " in capsys.readouterr().out

  export_path = str(tmp_path / "export")
  run_with(params + ["utils.run.export_path = %r" % export_path], mode="export")
  loader = ("import sys, tensorflow as tf\n"
            "m = tf.saved_model.load(sys.argv[1])\n"
            "ids = m.signatures['serving_default'](tf.constant([[119, 107, 104]]))\n"
            "txt = m.signatures['text'](tf.constant(['the cat']))\n"
            "assert 'mesh_tf' not in sys.modules\n"
            "print(ids['outputs'].shape, txt['outputs'].shape)\n")
  result = trainer_helpers.run_python_without_mesh_tf(loader, export_path,
                                                     cwd=str(tmp_path))
  assert result.stdout.strip().splitlines()[-1] == "(1, 16) (1,)"
