"""Vocabularies: Python and TF paths agree, EOS/PAD rules, SentencePiece on the fly."""
import os

import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import vocabulary

TEXTS = ["", "hello", "héllo wörld", "日本語のテキスト", "emoji \U0001F600 and tab\t",
         "line\nbreak"]


def test_byte_vocabulary_round_trip_python_and_tf_agree():
  vocab = vocabulary.ByteVocabulary()
  assert vocab.vocab_size == 259
  for text in TEXTS:
    ids = vocab.encode(text)
    assert ids == [b + 3 for b in text.encode("utf-8")]
    assert vocab.encode_tf(tf.constant(text)).numpy().tolist() == ids
    assert vocab.decode(ids) == text
    assert vocab.decode_tf(tf.constant(ids, tf.int32)).numpy().decode("utf-8") == text


def test_byte_vocabulary_decode_stops_at_eos_and_drops_pad_unk_extra():
  vocab = vocabulary.ByteVocabulary(extra_ids=5)
  assert vocab.vocab_size == 264
  hello = vocab.encode("héllo")
  cases = [
      hello + [1] + vocab.encode("after"),            # text after EOS is dropped
      [0, 0] + hello + [0],                            # PAD anywhere is dropped
      hello[:1] + [2, 260, 263] + hello[1:],           # UNK and extra ids are not bytes
      hello[:2],                                       # cut inside a 2-byte character
      [1] + hello,                                     # EOS first: empty text
  ]
  expected = ["héllo", "héllo", "héllo", "h", ""]
  for ids, want in zip(cases, expected):
    assert vocab.decode(ids) == want
    assert vocab.decode_tf(tf.constant(ids, tf.int32)).numpy().decode("utf-8") == want


def test_byte_vocabulary_decode_tf_batched_rows():
  vocab = vocabulary.ByteVocabulary()
  rows = [vocab.encode("abc") + [1, 0, 0], vocab.encode("日本") + [0]]
  width = max(len(r) for r in rows)
  rows = [r + [0] * (width - len(r)) for r in rows]
  decoded = vocab.decode_tf(tf.constant(rows, tf.int32)).numpy()
  assert [d.decode("utf-8") for d in decoded] == [vocab.decode(r) for r in rows]


def test_byte_vocabulary_tf_ops_survive_a_saved_model(tmp_path):
  vocab = vocabulary.ByteVocabulary()
  module = tf.Module()
  module.encode = tf.function(vocab.encode_tf,
                              input_signature=[tf.TensorSpec([], tf.string)])
  module.decode = tf.function(vocab.decode_tf,
                              input_signature=[tf.TensorSpec([None], tf.int32)])
  tf.saved_model.save(module, str(tmp_path / "vocab"))
  loaded = tf.saved_model.load(str(tmp_path / "vocab"))
  ids = loaded.encode(tf.constant("grüße"))
  assert ids.numpy().tolist() == vocab.encode("grüße")
  assert loaded.decode(tf.concat([ids, [1, 50]], 0)).numpy().decode() == "grüße"


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
  folder = tmp_path_factory.mktemp("spm")
  corpus = folder / "corpus.txt"
  sentences = ["the quick brown fox jumps over the lazy dog number %d" % i
               for i in range(200)]
  sentences += ["größere Häuser stehen am Fluss", "a tiny corpus for a tiny model"] * 20
  corpus.write_text("\n".join(sentences), encoding="utf-8")
  return vocabulary.train_sentencepiece(str(corpus), vocab_size=60,
                                        model_prefix=str(folder / "m"))


def test_sentencepiece_trained_on_the_fly_round_trips(spm_model):
  vocab = vocabulary.SentencePieceVocabulary(spm_model, extra_ids=3)
  assert os.path.exists(spm_model)
  base = vocab.vocab_size - 3
  assert 10 < base <= 60
  sentence = "the lazy fox jumps over größere Häuser"
  ids = vocab.encode(sentence)
  assert all(2 <= i < base for i in ids)
  assert vocab.decode(ids) == sentence
  assert vocab.decode(ids + [1] + ids) == sentence
  assert vocab.encode_tf(tf.constant(sentence)).numpy().tolist() == ids
  batch = tf.constant([ids + [1, 0], ids[:3] + [0] * (len(ids) - 1)], tf.int32)
  decoded = [t.decode("utf-8") for t in vocab.decode_tf(batch).numpy()]
  assert decoded == [sentence, vocab.decode(ids[:3])]


def test_sentencepiece_from_strings_in_a_tf_data_pipeline(tmp_path):
  model = vocabulary.train_sentencepiece(
      ["alpha beta gamma delta\n" * 30, "beta gamma epsilon zeta"] * 10, vocab_size=30,
      model_prefix=str(tmp_path / "s"))
  vocab = vocabulary.SentencePieceVocabulary(model)
  ds = tf.data.Dataset.from_tensor_slices(["alpha beta", "zeta gamma"]).map(
      vocab.encode_tf)
  assert [vocab.decode(x) for x in ds.as_numpy_iterator()] == ["alpha beta",
                                                               "zeta gamma"]


def test_sentencepiece_missing_model_file_names_the_file(tmp_path):
  path = str(tmp_path / "nope.model")
  with pytest.raises(mtf.errors.MtfError, match="nope.model"):
    vocabulary.SentencePieceVocabulary(path)


def test_sentencepiece_model_with_other_special_ids_is_refused(tmp_path):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  prefix = str(tmp_path / "default_ids")
  spm.SentencePieceTrainer.Train(
      sentence_iterator=iter(["some words to learn from"] * 50), model_prefix=prefix,
      vocab_size=20, hard_vocab_limit=False, minloglevel=2)
  with pytest.raises(mtf.errors.MtfError, match="default_ids.model.*pad_id"):
    vocabulary.SentencePieceVocabulary(prefix + ".model")


def test_train_sentencepiece_missing_glob_names_the_pattern(tmp_path):
  pattern = str(tmp_path / "missing*.txt")
  with pytest.raises(mtf.errors.MtfError, match="missing"):
    vocabulary.train_sentencepiece(pattern, vocab_size=30)


def test_get_tfds_vocabulary_without_data_names_dataset_and_dir(tmp_path):
  with pytest.raises(mtf.errors.MtfError, match="lm1b.*" + str(tmp_path)):
    vocabulary.get_tfds_vocabulary("lm1b", tfds_data_dir=str(tmp_path))


def test_vocabularies_are_gin_configurable():
  import gin  # pylint: disable=g-import-not-at-top
  # A scoped binding leaves the global gin config of other tests alone.
  gin.parse_config("h5_vocab_test/vocabulary.ByteVocabulary.extra_ids = 7")
  with gin.config_scope("h5_vocab_test"):
    assert vocabulary.ByteVocabulary().vocab_size == 266
  assert vocabulary.ByteVocabulary().vocab_size == 259


def test_trained_sentencepiece_vocabulary_is_trained_once_and_reused(tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 40
                    + "pack my box with five dozen liquor jugs\n" * 40)
  prefix = str(tmp_path / "spm")
  first = vocabulary.trained_sentencepiece_vocabulary(
      vocab_size=40, text_glob=str(corpus), model_prefix=prefix)
  assert os.path.exists(prefix + ".model")
  mtime = os.path.getmtime(prefix + ".model")
  again = vocabulary.trained_sentencepiece_vocabulary(
      vocab_size=40, text_glob=str(corpus), model_prefix=prefix)
  assert os.path.getmtime(prefix + ".model") == mtime
  text = "the lazy fox"
  assert first.encode(text) == again.encode(text)
  assert again.decode(again.encode(text)) == text
  with pytest.raises(mtf.MtfError, match="nothing_here"):
    vocabulary.trained_sentencepiece_vocabulary(
        vocab_size=40, text_glob=str(tmp_path / "nothing_here*.txt"))
