"""The embedded default corpus: the help-topic texts that ship with Python.

`pydoc_data.topics` holds the text `help("if")` and friends print (about 0.45 MB of
English prose and grammar on CPython 3.11), so an LM can be trained with nothing
downloaded. Topics are taken in sorted order and cut into paragraphs at blank lines;
repeated paragraphs are kept once, and every `1/validation_fraction`-th paragraph is
held out for validation, so the splits are disjoint and fixed for a given Python.
"""
import random
import re

import gin
import tensorflow as tf

from models.transformer import dataset as dataset_lib
from models.transformer import packing

EOS_ID = 1


def default_corpus_text():
  """The whole corpus as one string: the pydoc topics in sorted order."""
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  return "\n\n".join(topics.topics[name].strip("\n") for name in sorted(topics.topics))


def default_corpus_paragraphs():
  """The corpus paragraphs (split at blank lines), first occurrence of each only."""
  seen = set()
  paragraphs = []
  for paragraph in re.split(r"\n[ \t]*\n", default_corpus_text()):
    paragraph = paragraph.strip("\n")
    if paragraph.strip() and paragraph not in seen:
      seen.add(paragraph)
      paragraphs.append(paragraph)
  return paragraphs


def default_corpus_split(dataset_split, validation_fraction=0.05):
  """The paragraphs of one split: every round(1/fraction)-th one is validation."""
  dataset_lib.check_split(dataset_split)
  period = max(2, int(round(1.0 / validation_fraction)))
  held_out = dataset_lib.is_eval_split(dataset_split)
  return [p for i, p in enumerate(default_corpus_paragraphs())
          if (i % period == period - 1) == held_out]


def _chunks_with_eos(tokens, max_tokens):
  """Splits 1-D ids into pieces of at most max_tokens, each followed by EOS."""
  framed = tf.signal.frame(tokens, max_tokens, max_tokens, pad_end=True, pad_value=0)
  pieces = tf.RaggedTensor.from_tensor(framed, padding=0)
  return tf.concat([pieces, tf.fill([pieces.nrows(), 1], EOS_ID)], axis=1)


def _pieces_with_eos(ids, max_tokens):
  """_chunks_with_eos of a Python list of ids: pieces of at most max_tokens, each
  followed by EOS."""
  return [list(ids[i:i + max_tokens]) + [EOS_ID] for i in range(0, len(ids), max_tokens)]


def paragraphs_in_order(dataset_split, validation_fraction=0.05, shuffle_seed=1):
  """The paragraphs of a split in the order its dataset reads them: train shuffled
  once with shuffle_seed (None keeps corpus order), validation in corpus order."""
  paragraphs = default_corpus_split(dataset_split, validation_fraction)
  if shuffle_seed is not None and not dataset_lib.is_eval_split(dataset_split):
    random.Random(shuffle_seed).shuffle(paragraphs)
  return paragraphs


def pieces_dataset(paragraphs, vocabulary, length):
  """A streaming dataset of {"targets": ids} pieces of the paragraphs: each at most
  length - 1 ids, followed by EOS."""
  texts = tf.data.Dataset.from_tensor_slices(tf.constant(paragraphs))

  def to_pieces(text):
    ids = tf.cast(vocabulary.encode_tf(text), tf.int32)
    return tf.data.Dataset.from_tensor_slices(_chunks_with_eos(ids, length - 1))
  return texts.flat_map(to_pieces).map(lambda ids: {"targets": ids})


@gin.configurable(module="dataset")
def default_corpus_dataset(sequence_length, vocabulary, dataset_split, pack=True,
                           validation_fraction=0.05, shuffle_seed=1):
  """Dataset function over the default corpus: one LM example per paragraph.

  Paragraphs longer than a row are cut into consecutive pieces (each EOS-terminated),
  so no text is lost. The train paragraphs are shuffled once with shuffle_seed (None
  keeps corpus order); validation keeps corpus order. Packed rows are made once, in
  memory (packing.pack_in_memory: the rows pack_dataset would stream).
  """
  paragraphs = paragraphs_in_order(dataset_split, validation_fraction, shuffle_seed)
  length = packing.lengths_per_key(sequence_length, ["targets"])["targets"]
  vocab = dataset_lib.targets_vocabulary(vocabulary)
  if pack:
    return packing.pack_in_memory(
        [{"targets": piece} for text in paragraphs
         for piece in _pieces_with_eos(vocab.encode(text), length - 1)],
        length, {"targets": tf.int32})
  return packing.pack_or_pad(pieces_dataset(paragraphs, vocab, length), length,
                             pack=False)
