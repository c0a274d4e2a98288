"""Export: a SavedModel of a lowered decoding graph loads and runs without mesh_tf."""
import json

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import trainer_helpers
from models.transformer.trainer import decode_io
from models.transformer.trainer import export
from models.transformer.vocabulary import ByteVocabulary


class ShiftByOneModel:
  """A stand-in decoder: each non-padding id becomes id + round(w), w a variable = 1."""

  def sample_autoregressive(self, partial_sequences, variable_dtype=None, **kwargs):
    del kwargs
    w = mtf.get_variable(partial_sequences.mesh, "shift", [],
                         initializer=tf.constant_initializer(1.0), dtype=variable_dtype)
    ids = mtf.cast(partial_sequences, tf.float32)
    nonpad = mtf.cast(mtf.greater(partial_sequences, 0), tf.float32)
    return mtf.cast((ids + w) * nonpad, tf.int32)


def _decode_fn(batch_size=4, length=8):
  graph = decode_io.DecodeGraph(ShiftByOneModel(), batch_size, length,
                                mtf.VariableDType(tf.float32))
  return graph.make_decode_fn(mtf.PlacementMeshImpl("", "", [""]))


def test_decode_prompts_writes_one_line_per_prompt(tmp_path):
  vocab = ByteVocabulary()
  inputs = tmp_path / "prompts.txt"
  inputs.write_text("abc\nhello\n\nxyz\nHAL\n")
  out = tmp_path / "out" / "decodes.txt"
  lines = decode_io.decode_prompts(_decode_fn(), vocab, 4, 8, str(inputs), str(out))
  assert lines == ["bcd", "ifmmp", "", "yz{", "IBM"]
  assert out.read_text().split("\n")[:-1] == lines


_LOADER = """
import json, sys
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
ids = loaded.signatures["ids"](ids=tf.constant([[5, 6, 7], [9, 0, 0]], tf.int32))
text = loaded.signatures["serving_default"](input=tf.constant(["abc", "HAL"]))
assert "mesh_tf" not in sys.modules, sorted(m for m in sys.modules if "mesh" in m)
print(json.dumps({"ids": ids["outputs"].numpy().tolist(),
                  "text": [t.decode() for t in text["outputs"].numpy()],
                  "inputs": [t.decode() for t in text["inputs"].numpy()],
                  "keys": sorted(loaded.signatures.keys())}))
"""


def test_saved_model_loads_without_mesh_tf(tmp_path):
  module, signatures = export.build_module(_decode_fn(), ByteVocabulary(), 4, 8)
  path = str(tmp_path / "export")
  tf.saved_model.save(module, path, signatures=signatures)
  result = trainer_helpers.run_python_without_mesh_tf(_LOADER, path, cwd=str(tmp_path))
  out = json.loads(result.stdout.strip().splitlines()[-1])
  np.testing.assert_array_equal(out["ids"], [[6, 7, 8, 0, 0, 0, 0, 0],
                                             [10, 0, 0, 0, 0, 0, 0, 0]])
  assert out["text"] == ["bcd", "IBM"]
  assert out["inputs"] == ["abc", "HAL"]
  assert out["keys"] == ["ids", "serving_default"]


def test_export_decodes_more_prompts_than_its_batch_and_refuses_bad_prompts():
  module, _ = export.build_module(_decode_fn(batch_size=4, length=8), ByteVocabulary(),
                                  4, 8)
  rows = np.arange(1, 10, dtype=np.int32)[:, None] * 3 + np.arange(3, dtype=np.int32)
  out = module.decode_ids(tf.constant(rows))["outputs"].numpy()  # 9 rows, batch 4
  assert out.shape == (9, 8)
  np.testing.assert_array_equal(out[:, :3], rows + 1)
  assert not out[:, 3:].any()
  with pytest.raises(tf.errors.InvalidArgumentError, match="prompt is longer than this "
                     "export allows"):
    module.decode_ids(tf.constant([[5] * 8], tf.int32))
  with pytest.raises(tf.errors.InvalidArgumentError, match="prompt is longer"):
    module.decode_text(tf.constant(["abcdefgh"]))
  vocab_size = ByteVocabulary().vocab_size
  with pytest.raises(tf.errors.InvalidArgumentError, match="< the vocabulary size %d"
                     % vocab_size):
    module.decode_ids(tf.constant([[5, vocab_size]], tf.int32))
  with pytest.raises(tf.errors.InvalidArgumentError, match=">= 0"):
    module.decode_ids(tf.constant([[-1, 5]], tf.int32))
