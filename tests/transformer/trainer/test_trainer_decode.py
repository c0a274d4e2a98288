"""Decode and export modes end to end on a trained tiny LM (uses decoding.py): decode
mode's lines are the model's greedy continuations, and the exported SavedModel, loaded
without mesh_tf, decodes the same strings (and ids) as decode mode."""
import json

import gin
import numpy as np

import trainer_helpers
from decode_checks import assert_greedy_lm_continuations
from models.transformer.trainer import gin_setup
from models.transformer import utils
from models.transformer.vocabulary import ByteVocabulary
from trainer_helpers import run_with

PROMPTS = ["the cat", "the dog ran", "", "over"]

_LOADER = """
import json, sys
import tensorflow as tf
m = tf.saved_model.load(sys.argv[1])
prompts = json.loads(sys.argv[2])
served = m.signatures["serving_default"](input=tf.constant(prompts))
ids = m.signatures["ids"](ids=tf.constant(json.loads(sys.argv[3]), tf.int32))
assert "mesh_tf" not in sys.modules
print(json.dumps({"inputs": [t.decode("utf-8", "ignore") for t in
                             served["inputs"].numpy()],
                  "outputs": [t.decode("utf-8", "ignore") for t in
                              served["outputs"].numpy()],
                  "ids": ids["outputs"].numpy().tolist(),
                  "signatures": sorted(m.signatures.keys())}))
"""


def _one_line(text):
  return text.replace("\r", " ").replace("\n", " ")


def test_decode_and_export_of_a_trained_lm(tmp_path, capsys):
  vocab = ByteVocabulary()
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "m"
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=2)
  run_with(params)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("".join(p + "\n" for p in PROMPTS))
  output = tmp_path / "decoded.txt"
  lines = run_with(params + ["utils.run.decode_input_file = %r" % str(prompts),
                             "utils.run.decode_output_file = %r" % str(output)],
                   mode="decode")
  assert output.read_text().split("\n")[:-1] == lines and len(lines) == len(PROMPTS)
  printed = capsys.readouterr().out
  for prompt, line in zip(PROMPTS, lines):
    assert "%r -> %r" % (prompt, line) in printed

  export_path = str(tmp_path / "export")
  run_with(params + ["utils.run.export_path = %r" % export_path], mode="export")
  prompt_ids = [vocab.encode(p) for p in PROMPTS]
  id_rows = [row + [0] * (16 - len(row)) for row in prompt_ids]
  result = trainer_helpers.run_python_without_mesh_tf(
      _LOADER, export_path, json.dumps(PROMPTS), json.dumps(id_rows), cwd=str(tmp_path))
  served = json.loads(result.stdout.strip().splitlines()[-1])
  assert served["signatures"] == ["ids", "serving_default"]
  assert served["inputs"] == PROMPTS
  assert [_one_line(t) for t in served["outputs"]] == lines
  assert [_one_line(vocab.decode(row)) for row in served["ids"]] == lines

  # What was decoded is the greedy continuation under the checkpoint's own logits.
  gin.clear_config()
  try:
    gin_setup.parse_gin([], params)
    estimator = utils.get_estimator(
        "lm", vocab, "", "", str(model_dir), 8, 16, True, 0.01, 2, 2, None, None, None,
        None, False, None, 2, None)
    assert_greedy_lm_continuations(estimator, prompt_ids, np.array(served["ids"]),
                                   vocab.vocab_size)
  finally:
    gin.clear_config()
