"""The embedded default corpus: size, determinism, disjoint splits, nothing lost."""
import hashlib

import numpy as np
import pytest

import mesh_tf as mtf
from models.transformer import default_corpus
from models.transformer import packing
from models.transformer import vocabulary

BYTES = vocabulary.ByteVocabulary()


def test_corpus_is_large_and_deterministic():
  text = default_corpus.default_corpus_text()
  assert len(text.encode("utf-8")) > 100 * 1024
  assert "if" in text and "statement" in text
  again = default_corpus.default_corpus_text()
  assert hashlib.sha256(text.encode()).digest() == hashlib.sha256(again.encode()).digest()
  assert default_corpus.default_corpus_paragraphs() == (
      default_corpus.default_corpus_paragraphs())


def test_splits_are_disjoint_and_cover_the_paragraphs():
  paragraphs = default_corpus.default_corpus_paragraphs()
  assert len(paragraphs) > 1000 and len(set(paragraphs)) == len(paragraphs)
  train = default_corpus.default_corpus_split("train")
  validation = default_corpus.default_corpus_split("validation")
  assert set(train).isdisjoint(validation)
  assert sorted(train + validation) == sorted(paragraphs)
  assert 0.03 < len(validation) / len(paragraphs) < 0.07
  assert default_corpus.default_corpus_split("eval") == validation


def _segments(row):
  """Ids of the packed examples of one row (EOS included)."""
  seg = row["targets_segmentation"]
  return [row["targets"][seg == s].tolist() for s in range(1, seg.max() + 1)]


def test_validation_dataset_reconstructs_its_paragraphs():
  ds = default_corpus.default_corpus_dataset(64, BYTES, "validation")
  rows = list(ds.as_numpy_iterator())
  pieces = [ids for row in rows for ids in _segments(row)]
  assert all(row["targets"].shape == (64,) for row in rows)
  assert all(ids[-1] == 1 and 1 not in ids[:-1] for ids in pieces)
  # Long paragraphs are cut into several pieces; in token space nothing is lost.
  paragraphs = default_corpus.default_corpus_split("validation")
  assert [i for ids in pieces for i in ids[:-1]] == BYTES.encode("".join(paragraphs))
  assert len(pieces) > len(paragraphs) > 0
  assert len(rows) < len(pieces)  # several pieces per row: it is packed


def test_train_dataset_is_deterministic_and_padded_variant_works():
  first = [r["targets"] for r in
           default_corpus.default_corpus_dataset(128, BYTES, "train").take(20)
           .as_numpy_iterator()]
  second = [r["targets"] for r in
            default_corpus.default_corpus_dataset(128, BYTES, "train").take(20)
            .as_numpy_iterator()]
  np.testing.assert_array_equal(np.stack(first), np.stack(second))
  padded = next(default_corpus.default_corpus_dataset(
      {"targets": 32}, BYTES, "train", pack=False).as_numpy_iterator())
  assert sorted(padded) == ["targets"] and padded["targets"].shape == (32,)
  assert 1 in padded["targets"]


@pytest.mark.parametrize("split,length,paragraphs", [("validation", 64, None),
                                                     ("train", 64, 300),
                                                     ("train", 17, 100)])
def test_rows_packed_in_memory_are_the_streaming_packers(split, length, paragraphs):
  """The dataset packs once in NumPy; the tf.data packer over the same pieces streams
  the same rows (on a prefix of the paragraphs, all but the prefix's last row)."""
  ds = default_corpus.default_corpus_dataset(length, BYTES, split)
  texts = default_corpus.paragraphs_in_order(split)[:paragraphs]
  streamed = list(packing.pack_dataset(default_corpus.pieces_dataset(
      default_corpus.pieces(texts, BYTES, length)), length).as_numpy_iterator())
  if paragraphs is not None:
    streamed = streamed[:-1]
  got = list(ds.take(len(streamed)).as_numpy_iterator())
  assert len(got) == len(streamed) > 30
  for g, w in zip(got, streamed):
    assert sorted(g) == sorted(w) == ["targets", "targets_position",
                                      "targets_segmentation"]
    for name in w:
      np.testing.assert_array_equal(g[name], w[name], err_msg=name)
      assert g[name].dtype == w[name].dtype == np.int32, name
  if paragraphs is None:  # the whole split: no row more or less
    assert int(ds.cardinality()) == len(streamed)


def test_bad_split_is_refused():
  with pytest.raises(mtf.errors.MtfError, match="dataset_split"):
    default_corpus.default_corpus_dataset(64, BYTES, "training")
