"""T2tVocabulary: a tensor2tensor subword vocabulary file written here, encoded and
decoded by hand-worked examples (tokenization, greedy longest subtokens, escaping of
characters outside the alphabet), in Python and TF, and through gin."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import t2t_vocabulary as tv

SUBTOKENS = ["<pad>", "<EOS>", "the_", "cat_", ", _", "ca", "t", "s_", "_", "\\", "u",
             ";"] + [str(d) for d in range(10)]


@pytest.fixture()
def vocab_file(tmp_path):
  path = tmp_path / "vocab.toy.subwords"
  path.write_text("".join("'%s'\n" % s for s in SUBTOKENS))
  return path


def test_encode_and_decode_by_hand(vocab_file):
  vocab = tv.T2tVocabulary(str(vocab_file))
  assert vocab.vocab_size == len(SUBTOKENS)
  # Tokens: the | cat | ", " | the | cats (the spaces between words are implied);
  # "cats_" is cut greedily into ca + t + s_.
  ids = vocab.encode("the cat, the cats")
  assert ids == [2, 3, 4, 2, 5, 6, 7]
  assert vocab.decode(ids + [1, 3]) == "the cat, the cats"  # stops at EOS
  assert vocab.decode([0, 2, 0, 3]) == "the cat"  # PAD dropped


def test_characters_outside_the_alphabet_are_escaped(vocab_file):
  vocab = tv.T2tVocabulary(str(vocab_file))
  # "x" -> "\120;_", "_" -> "\u_", "y" -> "\121;_", each from single characters.
  ids = vocab.encode("x_y")
  pieces = "".join(SUBTOKENS[i] for i in ids)
  assert pieces == "\\120;_\\u_\\121;_", pieces
  assert vocab.decode(ids) == "x_y"
  assert vocab.decode(vocab.encode("the cats, ço")) == "the cats, ço"


def test_tf_versions_and_gin(vocab_file):
  gin.parse_config("""
      t2t_vocabulary.get_t2t_vocabulary.data_dir = %r
      t2t_vocabulary.get_t2t_vocabulary.vocabulary_filename = %r
  """ % (str(vocab_file.parent), vocab_file.name))
  try:
    vocab = gin.get_configurable("t2t_vocabulary.get_t2t_vocabulary")()
  finally:
    gin.clear_config()
  ids = vocab.encode_tf(tf.constant("the cat"))
  np.testing.assert_array_equal(ids.numpy(), [2, 3])
  assert vocab.decode_tf(tf.constant([2, 3, 1, 2], tf.int32)).numpy() == b"the cat"


def test_bad_files_are_named(tmp_path):
  with pytest.raises(mtf.MtfError, match="t2t vocabulary file .*missing does not exist"):
    tv.T2tVocabulary(str(tmp_path / "missing"))
  path = tmp_path / "tiny"
  path.write_text("'<pad>'\n'<EOS>'\n'ab_'\n")
  with pytest.raises(mtf.MtfError, match="cannot spell 'ba'"):
    tv.T2tVocabulary(str(path)).encode("ba")
