"""Synthetic encoder-decoder tasks: reverse or sort a random token sequence.

Example i of a split is drawn with stateless random ops from (seed, split, i), so
each split is the same on every run, train and validation draw from different streams,
and the train split is unlimited. Inputs and targets are EOS-terminated and padded.
"""
import gin
import tensorflow as tf

from mesh_tf import errors
from models.transformer import dataset as dataset_lib
from models.transformer import packing
from models.transformer import vocabulary as vocabulary_lib

EOS_ID = 1
_SPLIT_STREAMS = {"train": 0, "validation": 1, "eval": 1, "dev": 1, "test": 2}


def default_first_token_id(vocabulary, num_tokens):
  """Id of the first task token: 'a' for ByteVocabulary (readable), else 3."""
  vocab = dataset_lib.targets_vocabulary(vocabulary)
  if isinstance(vocab, vocabulary_lib.ByteVocabulary) and num_tokens <= 26:
    return vocab.encode("a")[0]
  return 3


def _random_sequences(sequence_length, vocabulary, dataset_split, num_tokens, length,
                      seed, first_token_id, num_examples):
  """Dataset of int32 [n] random task tokens, per the synthetic-task arguments."""
  dataset_lib.check_split(dataset_split)
  lengths = packing.lengths_per_key(sequence_length, ["inputs", "targets"])
  room = min(lengths.values()) - 1  # One position is left for EOS.
  if length is None:
    min_length, max_length = 1, room
  elif isinstance(length, int):
    min_length = max_length = length
  else:
    min_length, max_length = length
  if not 1 <= min_length <= max_length <= room:
    raise errors.MtfError(
        "synthetic task length %r does not fit sequence_length %r (at most %d tokens "
        "plus EOS)" % (length, sequence_length, room))
  if first_token_id is None:
    first_token_id = default_first_token_id(vocabulary, num_tokens)
  for name in ("inputs", "targets"):
    vocab = (dataset_lib.inputs_vocabulary(vocabulary) if name == "inputs"
             else dataset_lib.targets_vocabulary(vocabulary))
    if first_token_id < 2 or first_token_id + num_tokens > vocab.vocab_size:
      raise errors.MtfError(
          "synthetic task tokens %d..%d do not fit the %s vocabulary (size %d; ids 0 "
          "and 1 are PAD and EOS)" % (first_token_id, first_token_id + num_tokens - 1,
                                      name, vocab.vocab_size))
  stream = _SPLIT_STREAMS[dataset_split]

  def draw(index):
    key = tf.stack([tf.cast(seed, tf.int64) * 8 + stream, index])
    n = tf.random.stateless_uniform([], key, minval=min_length, maxval=max_length + 1,
                                    dtype=tf.int32)
    return tf.random.stateless_uniform([n], key + [0, 1 << 40], minval=first_token_id,
                                       maxval=first_token_id + num_tokens,
                                       dtype=tf.int32)
  if num_examples is None:
    indices = tf.data.Dataset.counter()
  else:
    indices = tf.data.Dataset.range(num_examples)
  return indices.map(draw, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True), (
      lengths)


def _task_dataset(transform, sequence_length, vocabulary, dataset_split, num_tokens,
                  length, seed, first_token_id, num_train_examples,
                  num_validation_examples, pack):
  num_examples = (num_train_examples if dataset_split == "train"
                  else num_validation_examples)
  tokens, lengths = _random_sequences(sequence_length, vocabulary, dataset_split,
                                      num_tokens, length, seed, first_token_id,
                                      num_examples)
  examples = tokens.map(lambda x: {"inputs": tf.concat([x, [EOS_ID]], 0),
                                   "targets": tf.concat([transform(x), [EOS_ID]], 0)})
  return packing.pack_or_pad(examples, lengths, pack=pack)


@gin.configurable(module="dataset")
def synthetic_reverse_dataset(sequence_length, vocabulary, dataset_split, num_tokens=10,
                              length=None, seed=0, first_token_id=None,
                              num_train_examples=None, num_validation_examples=1024,
                              pack=False):
  """Dataset function: inputs are random tokens, targets the same tokens reversed.

  Args:
    sequence_length: int or {"inputs": n, "targets": n}.
    vocabulary: a Vocabulary or an (inputs, targets) pair; only its size is used.
    dataset_split: "train" or "validation"/"eval" (a different random stream).
    num_tokens: how many distinct tokens (ids first_token_id .. +num_tokens-1).
    length: tokens per example: an int, a (min, max) pair, or None for
      1 .. sequence_length-1.
    seed: the random seed of the task.
    first_token_id: id of the first token; None picks 'a' for ByteVocabulary, else 3.
    num_train_examples: None for an unlimited train split.
    num_validation_examples: size of the validation split.
    pack: pack several examples per row instead of padding.
  Returns:
    an unbatched dataset of {"inputs", "targets"} int32 features.
  """
  return _task_dataset(lambda x: tf.reverse(x, [0]), sequence_length, vocabulary,
                       dataset_split, num_tokens, length, seed, first_token_id,
                       num_train_examples, num_validation_examples, pack)


@gin.configurable(module="dataset")
def synthetic_sort_dataset(sequence_length, vocabulary, dataset_split, num_tokens=10,
                           length=None, seed=0, first_token_id=None,
                           num_train_examples=None, num_validation_examples=1024,
                           pack=False):
  """Dataset function: inputs are random tokens, targets the same tokens sorted.

  Arguments as for synthetic_reverse_dataset.
  """
  return _task_dataset(lambda x: tf.sort(x), sequence_length, vocabulary,
                       dataset_split, num_tokens, length, seed, first_token_id,
                       num_train_examples, num_validation_examples, pack)
