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
import numpy as np
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


def paragraphs_in_order(dataset_split, validation_fraction=0.05, shuffle_seed=1):
  """The paragraphs of a split in the order its dataset reads them: train shuffled
  once with shuffle_seed (None keeps corpus order), validation in corpus order."""
  paragraphs = default_corpus_split(dataset_split, validation_fraction)
  if shuffle_seed is not None and not dataset_lib.is_eval_split(dataset_split):
    random.Random(shuffle_seed).shuffle(paragraphs)
  return paragraphs


def pieces(paragraphs, vocabulary, length):
  """Each paragraph's ids cut into consecutive pieces of at most length - 1 ids, each
  followed by EOS (so no text is lost), in order."""
  step = length - 1
  return [list(ids[i:i + step]) + [EOS_ID] for ids in map(vocabulary.encode, paragraphs)
          for i in range(0, len(ids), step)]


def pieces_dataset(pieces_list):
  """A dataset of {"targets": piece} (1-D int32 ids), one element per piece."""
  flat = np.array([i for p in pieces_list for i in p], np.int32)
  rows = tf.RaggedTensor.from_row_lengths(flat, [len(p) for p in pieces_list])
  return tf.data.Dataset.from_tensor_slices(rows).map(lambda ids: {"targets": ids})


@gin.configurable(module="dataset")
def default_corpus_dataset(sequence_length, vocabulary, dataset_split, pack=True,
                           validation_fraction=0.05, shuffle_seed=1):
  """Dataset function over the default corpus: one LM example per paragraph.

  Paragraphs longer than a row are cut into consecutive pieces (each EOS-terminated),
  so no text is lost. The train paragraphs are shuffled once with shuffle_seed (None
  keeps corpus order); validation keeps corpus order. Packed rows are made once, in
  memory (packing.pack_in_memory: the rows pack_dataset would stream).
  """
  length = packing.lengths_per_key(sequence_length, ["targets"])["targets"]
  cut = pieces(paragraphs_in_order(dataset_split, validation_fraction, shuffle_seed),
               dataset_lib.targets_vocabulary(vocabulary), length)
  if pack:
    return packing.pack_in_memory([{"targets": p} for p in cut], length,
                                  {"targets": tf.int32})
  return packing.pack_or_pad(pieces_dataset(cut), length, pack=False)
