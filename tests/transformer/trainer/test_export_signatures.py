"""The export's signatures: "serving_default" strings in, strings out under the
original's names ("input" -> "inputs", "outputs"), "ids" for token ids; a vocabulary
whose TF ops call Python cannot serve strings from a loaded SavedModel, so there
"serving_default" is the ids signature."""
import numpy as np
import tensorflow as tf

from models.transformer.trainer import export
from models.transformer.vocabulary import ByteVocabulary
from test_export import _decode_fn


class PythonOpsByteVocabulary(ByteVocabulary):
  """ByteVocabulary whose encode_tf goes through tf.numpy_function."""

  def encode_tf(self, s):
    ids = tf.numpy_function(lambda t: np.asarray(self.encode(t.decode()), np.int32),
                            [s], tf.int32, stateful=False)
    return tf.reshape(ids, [-1])


def _input_keys(concrete_function):
  """The names a signature's inputs take in the SavedModel (its specs' names)."""
  args, kwargs = concrete_function.structured_input_signature
  return sorted([spec.name for spec in args] + list(kwargs))


def test_serving_default_takes_and_returns_strings():
  module, signatures = export.build_module(_decode_fn(), ByteVocabulary(), 4, 8)
  assert sorted(signatures) == ["ids", "serving_default"]
  assert _input_keys(signatures["serving_default"]) == ["input"]
  assert _input_keys(signatures["ids"]) == ["ids"]
  assert sorted(signatures["serving_default"].structured_outputs) == ["inputs",
                                                                      "outputs"]
  out = signatures["serving_default"](input=tf.constant(["abc", "", "HAL"]))
  assert out["inputs"].numpy().tolist() == [b"abc", b"", b"HAL"]
  assert out["outputs"].numpy().tolist() == [b"bcd", b"", b"IBM"]
  ids = module.decode_ids(tf.constant([[100, 101, 102]], tf.int32))["outputs"]
  assert ids.numpy()[0, :3].tolist() == [101, 102, 103]


def test_python_vocabulary_ops_leave_ids_as_the_serving_default(capsys):
  _, signatures = export.build_module(_decode_fn(), PythonOpsByteVocabulary(), 4, 8)
  assert signatures["serving_default"] is signatures["ids"]
  assert _input_keys(signatures["serving_default"]) == ["ids"]
  assert "run Python (tf.numpy_function)" in capsys.readouterr().out
