"""T2tVocabulary reads a tensor2tensor subword file (written here by hand) and encodes
and decodes as tensor2tensor's SubwordTextEncoder does; get_t2t_vocabulary is the gin
entry the original's problems/t2t_*.gin files bind."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.trainer import gin_setup
from models.transformer import t2t_vocabulary

# '<pad>' and '<EOS>' take ids 0 and 1, as in tensor2tensor's files.
SUBTOKENS = (["<pad>", "<EOS>", "hello_", "wor", "ld_", "!_", "_", "\\", ";"] +
             list("abcdefghijklmnopqrstuvwxyz0123456789 ,.!"))


@pytest.fixture
def vocab_file(tmp_path):
  path = tmp_path / "vocab.test.subwords"
  path.write_text("".join("'%s'\n" % s for s in SUBTOKENS))
  return str(path)


def test_encode_is_greedy_longest_subtoken_and_decode_inverts(vocab_file):
  vocab = t2t_vocabulary.T2tVocabulary(vocab_file)
  assert vocab.vocab_size == len(SUBTOKENS)
  # Tokens "hello", "world", "!" (the space is implied); escaped "hello_", "world_",
  # "!_"; "world_" is cut into the longest pieces the file has: "wor" + "ld_".
  ids = vocab.encode("hello world!")
  assert ids == [2, 3, 4, 5]
  assert vocab.decode(ids + [1, 7, 7]) == "hello world!"  # stops at EOS
  for text in ["a_b, c.", "x  y", "caf\u00e9 42", "back\\slash", " lead"]:
    assert vocab.decode(vocab.encode(text)) == text, text
  # "_" (a token of its own) is escaped "\u", an unknown character "\<code>;".
  pieces = [SUBTOKENS[i] for i in vocab.encode("a_b")]
  assert "".join(pieces) == "a_\\u_b_"
  pieces = [SUBTOKENS[i] for i in vocab.encode("\u00e9")]
  assert "".join(pieces) == "\\233;_"


def test_tf_encoding_matches_python(vocab_file):
  vocab = t2t_vocabulary.T2tVocabulary(vocab_file)
  ids = vocab.encode_tf(tf.constant("hello world!"))
  np.testing.assert_array_equal(ids.numpy(), vocab.encode("hello world!"))
  assert vocab.decode_tf(ids).numpy().decode() == "hello world!"


def test_errors_name_the_file(vocab_file, tmp_path):
  with pytest.raises(mtf.errors.MtfError, match="missing.subwords"):
    t2t_vocabulary.T2tVocabulary(str(tmp_path / "missing.subwords"))
  small = tmp_path / "small.subwords"
  small.write_text("'<pad>'\n'<EOS>'\n'a'\n")
  with pytest.raises(mtf.errors.MtfError, match="small.subwords cannot spell 'b'"):
    t2t_vocabulary.T2tVocabulary(str(small)).encode("b")


def test_get_t2t_vocabulary_from_gin(vocab_file):
  gin_setup.import_configurables()
  gin.clear_config()
  try:
    with gin.unlock_config():
      gin.parse_config("t2t_vocabulary.get_t2t_vocabulary.data_dir = %r\n"
                       "t2t_vocabulary.get_t2t_vocabulary.vocabulary_filename = %r"
                       % tuple(vocab_file.rsplit("/", 1)))
    vocab = t2t_vocabulary.get_t2t_vocabulary()
  finally:
    gin.clear_config()
  assert vocab.encode("hello") == [2]
