"""File readers of the original's transformer/dataset.py (offered there under its names):
tab-separated parallel text and pretokenized TFRecords (also in the tensor2tensor file
layout). They return an unbatched dataset of packed rows unless `batch_size` is given.
"""
import os

import gin
import tensorflow as tf

from mesh_tf import errors
from models.transformer import packing


def _vocabularies(vocabulary):
  """(inputs vocabulary, targets vocabulary) from one vocabulary or a pair."""
  if isinstance(vocabulary, (tuple, list)):
    if len(vocabulary) != 2:
      raise errors.MtfError("vocabulary must be one vocabulary or an (inputs, targets) "
                            "pair, got %d" % len(vocabulary))
    return tuple(vocabulary)
  return vocabulary, vocabulary


def _batched(dataset, batch_size):
  if not batch_size:
    return dataset
  return dataset.batch(int(batch_size), drop_remainder=True)


def _split_tsv_line(line):
  """"inputs<TAB>targets" -> (inputs, targets): the text before the first tab and the
  rest. A line without a tab raises (naming the line) when the dataset is read."""
  parts = tf.strings.split(line, "\t", maxsplit=1)
  tf.debugging.assert_equal(
      tf.size(parts), 2,
      message=tf.strings.format("parallel TSV line has no tab: {}", line))
  return parts[0], parts[-1]


@gin.configurable(module="dataset")
def packed_parallel_tsv_dataset(dataset=gin.REQUIRED, dataset_split=gin.REQUIRED,
                                batch_size=None, sequence_length=gin.REQUIRED,
                                vocabulary=gin.REQUIRED, append_eos=True, eos_id=1,
                                max_encoded_len=0):
  """Parallel text, one "inputs<TAB>targets" pair per line, encoded and packed.

  dataset: a tf.data.Dataset of tf.string lines; dataset_split is ignored, as in the
  original. vocabulary: one vocabulary, or an (inputs, targets) pair. append_eos appends
  eos_id to both features. max_encoded_len > 0 drops pairs whose encoded inputs or
  targets (EOS included) are longer.
  """
  del dataset_split
  if not isinstance(dataset, tf.data.Dataset):
    raise errors.MtfError("packed_parallel_tsv_dataset: dataset must be a "
                          "tf.data.Dataset of lines, got %s" % type(dataset).__name__)
  inputs_vocab, targets_vocab = _vocabularies(vocabulary)

  def encode(line):
    inputs, targets = _split_tsv_line(line)
    features = {"inputs": inputs_vocab.encode_tf(inputs),
                "targets": targets_vocab.encode_tf(targets)}
    if append_eos:
      features = {k: tf.concat([tf.cast(v, tf.int32), [eos_id]], 0)
                  for k, v in features.items()}
    return features

  encoded = dataset.map(encode, num_parallel_calls=tf.data.AUTOTUNE)
  if max_encoded_len > 0:
    encoded = encoded.filter(
        lambda ex: tf.logical_and(tf.size(ex["inputs"]) <= max_encoded_len,
                                  tf.size(ex["targets"]) <= max_encoded_len))
  packed = packing.pack_or_pad(encoded, sequence_length, pack=True)
  return _batched(packed, batch_size)


def pretokenized_tfrecord_dataset(filenames, text2self, eos_included, repeat,
                                  batch_size, sequence_length, vocab_shift=0):
  """tf.train.Examples of int64 token lists ("targets", and "inputs" unless text2self),
  packed.

  eos_included: the stored sequences end in EOS already (else EOS is appended).
  vocab_shift: added to every stored id.
  """
  if isinstance(filenames, str):
    filenames = [filenames]
  missing = [f for f in filenames if not tf.io.gfile.exists(f)]
  if not filenames or missing:
    raise errors.MtfError("pretokenized_tfrecord_dataset: no such file(s): %s"
                          % (", ".join(missing) or "(none given)"),
                          file=missing[0] if missing else None)
  keys = ["targets"] if text2self else ["inputs", "targets"]
  spec = {k: tf.io.VarLenFeature(tf.int64) for k in keys}

  def decode(serialized):
    parsed = tf.io.parse_single_example(serialized, spec)
    out = {}
    for k in keys:
      ids = tf.cast(tf.sparse.to_dense(parsed[k]), tf.int32) + vocab_shift
      if not eos_included:
        ids = tf.concat([ids, [packing.EOS_ID]], 0)
      out[k] = ids
    return out

  dataset = tf.data.TFRecordDataset(filenames)
  if repeat:
    dataset = dataset.repeat()
  dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
  return _batched(packing.pack_or_pad(dataset, sequence_length, pack=True), batch_size)


@gin.configurable(module="dataset")
def pretokenized_t2t_dataset(dataset_name=gin.REQUIRED, text2self=False,
                             data_dir=gin.REQUIRED, dataset_split="train",
                             batch_size=None, sequence_length=gin.REQUIRED,
                             vocabulary=None, eos_included=True, vocab_shift=0):
  """The TFRecords a tensor2tensor problem wrote (`<data_dir>/<dataset_name>-<split>-*`),
  read by pretokenized_tfrecord_dataset; the train split repeats and is shuffled."""
  del vocabulary  # The files hold ids already.
  pattern = os.path.join(data_dir, "%s-%s-*" % (dataset_name, dataset_split))
  filenames = sorted(tf.io.gfile.glob(pattern))
  if not filenames:
    raise errors.MtfError("pretokenized_t2t_dataset: no file matches %s" % pattern,
                          file=pattern, hint="check data_dir, dataset_name and the "
                          "split name of the tensor2tensor files")
  is_train = dataset_split == "train"
  dataset = pretokenized_tfrecord_dataset(
      filenames=filenames, text2self=text2self, eos_included=eos_included,
      repeat=is_train, batch_size=batch_size, sequence_length=sequence_length,
      vocab_shift=vocab_shift)
  if is_train:
    dataset = dataset.shuffle(1000)
  return dataset
