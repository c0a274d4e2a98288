"""Input pipelines (the original's transformer/dataset.py), on tf.data.

A dataset function, `dataset_fn(sequence_length, vocabulary, dataset_split)` (called
with keyword arguments; the rest bound in gin), returns an unbatched dataset of dicts
of int32 features ("targets", and "inputs" for encoder-decoder tasks), encoded,
EOS-terminated and packed or padded; `batch_dataset` then repeats and batches. Nothing
here downloads: TFDS datasets load only from data on disk.
"""
import collections
import re

import gin
import tensorflow as tf

from mesh_tf import errors
from models.transformer import dataset_readers
from models.transformer import packing
from models.transformer import tfds_loading

# The packing/padding functions live in packing.py; they are part of this module's API.
pack_dataset = packing.pack_dataset
pack_or_pad = packing.pack_or_pad
trim_and_pad_dataset = packing.trim_and_pad_dataset
ensure_dataset_eos = packing.ensure_dataset_eos
# The original's file readers live in dataset_readers.py.
packed_parallel_tsv_dataset = dataset_readers.packed_parallel_tsv_dataset
pretokenized_tfrecord_dataset = dataset_readers.pretokenized_tfrecord_dataset
pretokenized_t2t_dataset = dataset_readers.pretokenized_t2t_dataset

EOS_ID = 1

EvalDataset = collections.namedtuple(
    "EvalDataset", ["name", "dataset_fn", "postprocess_fn", "metric_fns",
                    "dataset_size"])
EvalDataset.__new__.__defaults__ = (None,)
EvalDataset.__doc__ = ("A named evaluation set: dataset_fn as above, a postprocess_fn "
                       "for decoded text, metric_fns(targets, predictions) -> dict.")


def is_eval_split(dataset_split):
  """Whether dataset_split names held-out data ("validation", "eval", "test")."""
  return dataset_split in ("validation", "eval", "test", "dev")


def check_split(dataset_split):
  """Raises MtfError unless dataset_split is train or a held-out split."""
  if dataset_split != "train" and not is_eval_split(dataset_split):
    raise errors.MtfError("unknown dataset_split %r: use 'train' or 'validation'"
                          % (dataset_split,))


def inputs_vocabulary(vocabulary):
  """The vocabulary of "inputs": the first of a pair, or the single vocabulary."""
  return vocabulary[0] if isinstance(vocabulary, (tuple, list)) else vocabulary


def targets_vocabulary(vocabulary):
  """The vocabulary of "targets": the second of a pair, or the single vocabulary."""
  return vocabulary[1] if isinstance(vocabulary, (tuple, list)) else vocabulary


def _vocabulary_for(key, vocabulary):
  return inputs_vocabulary(vocabulary) if key.startswith("inputs") else (
      targets_vocabulary(vocabulary))


def encode_dataset(dataset, vocabulary):
  """Encodes every string feature into int32 ids (no EOS appended)."""
  def encode(features):
    return {k: _vocabulary_for(k, vocabulary).encode_tf(v) if v.dtype == tf.string
            else v for k, v in features.items()}
  return dataset.map(encode, num_parallel_calls=tf.data.AUTOTUNE)


def encode_all_features(dataset, vocabulary):
  """Encodes every feature (strings) into int32 ids and appends EOS to each."""
  def encode(features):
    return {k: tf.concat([_vocabulary_for(k, vocabulary).encode_tf(v), [EOS_ID]], 0)
            for k, v in features.items()}
  return dataset.map(encode, num_parallel_calls=tf.data.AUTOTUNE)


def supervised_to_dict(dataset, text2self):
  """(inputs, targets) pairs -> {"inputs", "targets"}, or {"targets"} if text2self."""
  if text2self:
    return dataset.map(lambda x, y: {"targets": y})
  return dataset.map(lambda x, y: {"inputs": x, "targets": y})


def pad_dataset_with_zeroed_out_examples(ds):
  """The dataset followed by an unlimited stream of all-zero examples like its own."""
  zeros = ds.take(1).map(
      lambda features: {k: tf.zeros_like(v) for k, v in features.items()})
  return ds.concatenate(zeros.repeat())


def batch_dataset(dataset, batch_size, repeat=True):
  """Repeats (optionally) and batches with drop_remainder, so every batch is full."""
  if repeat:
    dataset = dataset.repeat()
  return dataset.batch(int(batch_size), drop_remainder=True).prefetch(
      tf.data.AUTOTUNE)


def _text_files(glob):
  """Sorted files matching glob; MtfError if none does or all are blank."""
  patterns = [glob] if isinstance(glob, str) else list(glob)
  files = []
  for pattern in patterns:
    matched = sorted(tf.io.gfile.glob(pattern))
    if not matched:
      raise errors.MtfError("no text file matches %r" % pattern, file=pattern,
                            hint="check the path/glob bound in gin")
    files.extend(matched)
  if all(_is_blank(f) for f in files):
    raise errors.MtfError("no text in %s: %s empty or only whitespace"
                          % (", ".join(files), "it is" if len(files) == 1 else "all are"),
                          file=files[0], hint="check the path/glob bound in gin")
  return files


def _is_blank(path, probe_bytes=1 << 16):
  """Whether a file is empty or (judging by its first probe_bytes) only whitespace."""
  if tf.io.gfile.stat(path).length > probe_bytes:
    return False
  with tf.io.gfile.GFile(path, "rb") as f:
    return not f.read().strip()


# TF's file errors read "<path>; <reason>", e.g. "/data/a.txt; No such file or directory".
_FILE_ERROR = re.compile(r"((?:/|[A-Za-z][\w+.-]*://)[^\s;]*); ([^\n\[]+)")


def read_error_summary(error):
  """(one line, data file or None) describing an error an input pipeline raised (a
  tf.errors.OpError, or an MtfError raised from one)."""
  cause = error
  while not isinstance(cause, tf.errors.OpError) and cause.__cause__ is not None:
    cause = cause.__cause__
  text = getattr(cause, "message", None) or str(cause)
  match = _FILE_ERROR.search(text)
  if match:
    path = match.group(1)
    return "data file %s: %s" % (path, match.group(2).strip()), path
  text = re.sub(r"\{\{[^}]*\}\}", "", text).strip()
  line = text.splitlines()[0].strip() if text else type(cause).__name__
  return line, getattr(error, "file", None)


def make_text_line_dataset(glob):
  """tf.string dataset of the lines of the files matching glob (sorted order)."""
  return tf.data.TextLineDataset(_text_files(glob))


@gin.configurable(module="dataset")
def simple_text_line_dataset(glob=gin.REQUIRED, shuffle_buffer_size=100000, seed=None):
  """{"targets": line} for each line of the files matching glob, optionally shuffled."""
  dataset = make_text_line_dataset(glob)
  if shuffle_buffer_size:
    dataset = dataset.shuffle(shuffle_buffer_size, seed=seed)
  return dataset.map(lambda line: {"targets": line})


@gin.configurable(module="dataset")
def sample_from_text_line_datasets(glob_weight_list, shuffle_buffer_size=100000,
                                   prefetch=1000, seed=None):
  """{"targets": line} drawn from several globs with the given weights, unlimited."""
  globs, weights = zip(*glob_weight_list)
  sources = [make_text_line_dataset(g).repeat().shuffle(shuffle_buffer_size, seed=seed)
             for g in globs]
  dataset = tf.data.Dataset.sample_from_datasets(sources, weights=list(weights),
                                                 seed=seed)
  return dataset.map(lambda line: {"targets": line}).prefetch(prefetch)


def _held_out(text, validation_fraction):
  """Deterministic split by content: a hash of the text picks the held-out lines."""
  bucket = tf.strings.to_hash_bucket_fast(text, 10000)
  return bucket < int(round(validation_fraction * 10000))


def lm_features(dataset, sequence_length, vocabulary, pack=True):
  """{"targets": text} -> encoded, EOS-terminated, packed or padded features."""
  dataset = dataset.filter(lambda ex: tf.strings.length(ex["targets"]) > 0)
  dataset = encode_all_features(dataset, vocabulary)
  return pack_or_pad(dataset, sequence_length, pack=pack, ensure_eos=True)


@gin.configurable(module="dataset")
def text_line_dataset(sequence_length, vocabulary, dataset_split, glob=gin.REQUIRED,
                      validation_glob=None, validation_fraction=0.05, pack=True):
  """Dataset function: one LM example per non-blank line of the files matching glob;
  the validation split is `validation_glob`, else the lines hashing into the held-out
  fraction."""
  check_split(dataset_split)
  source = validation_glob if is_eval_split(dataset_split) and validation_glob else glob
  lines = make_text_line_dataset(source).map(tf.strings.strip)
  if not validation_glob:
    held_out = is_eval_split(dataset_split)
    lines = lines.filter(lambda s: tf.equal(_held_out(s, validation_fraction), held_out))
  return lm_features(lines.map(lambda s: {"targets": s}), sequence_length, vocabulary,
                     pack=pack)


@gin.configurable(module="dataset")
def text_corpus_dataset(sequence_length, vocabulary, dataset_split, glob=gin.REQUIRED,
                        validation_fraction=0.05):
  """Dataset function: whole text files cut into sequences of length-1 tokens and EOS;
  the last `validation_fraction` of each file's tokens is the validation split."""
  check_split(dataset_split)
  length = packing.lengths_per_key(sequence_length, ["targets"])["targets"]
  vocab = targets_vocabulary(vocabulary)
  held_out = is_eval_split(dataset_split)

  def split_tokens(path):
    tokens = vocab.encode_tf(tf.io.read_file(path))
    n = tf.size(tokens)
    cut = n - tf.cast(tf.cast(n, tf.float32) * validation_fraction, tf.int32)
    return tokens[cut:] if held_out else tokens[:cut]

  files = tf.data.Dataset.from_tensor_slices(_text_files(glob))
  tokens = files.map(split_tokens).unbatch()
  chunks = tokens.batch(length - 1)
  return chunks.map(lambda c: {"targets": packing.trim_and_pad_to_length(
      tf.concat([c, [EOS_ID]], 0), length)})


def _tfds_features(dataset_name, text2self, tfds_data_dir, dataset_split):
  """A TFDS split as {"inputs"?, "targets"} dicts (data must be on disk)."""
  check_split(dataset_split)
  dataset = tfds_loading.load_tfds(dataset_name, dataset_split, tfds_data_dir)
  return supervised_to_dict(dataset, text2self)


@gin.configurable(module="dataset")
def pretokenized_tfds_dataset(dataset_name=gin.REQUIRED, text2self=gin.REQUIRED,
                              tfds_data_dir=gin.REQUIRED, dataset_split=gin.REQUIRED,
                              batch_size=None, sequence_length=gin.REQUIRED,
                              vocabulary=None, pack=True):
  """A TFDS dataset of token ids, EOS appended, packed; batched only with batch_size."""
  del vocabulary  # The ids come from the dataset's own encoder.
  dataset = _tfds_features(dataset_name, text2self, tfds_data_dir, dataset_split)
  not_ids = [k for k, spec in dataset.element_spec.items() if not spec.dtype.is_integer]
  if not_ids:
    raise errors.MtfError(
        "TFDS dataset %r is not pretokenized: feature(s) %s hold %s, not token ids"
        % (dataset_name, ", ".join(not_ids), dataset.element_spec[not_ids[0]].dtype.name),
        hint="use dataset.untokenized_tfds_dataset with a vocabulary")
  dataset = dataset.map(lambda ex: {k: tf.concat([tf.cast(v, tf.int32), [EOS_ID]], 0)
                                    for k, v in ex.items()})
  dataset = pack_or_pad(dataset, sequence_length, pack=pack, ensure_eos=True)
  return batch_dataset(dataset, batch_size) if batch_size else dataset


@gin.configurable(module="dataset")
def untokenized_tfds_dataset(dataset_name=gin.REQUIRED, text2self=gin.REQUIRED,
                             tfds_data_dir=gin.REQUIRED, dataset_split=gin.REQUIRED,
                             batch_size=None, sequence_length=gin.REQUIRED,
                             vocabulary=gin.REQUIRED, pack=gin.REQUIRED):
  """A TFDS text dataset, encoded with `vocabulary`, EOS appended, packed or padded;
  batched only with batch_size."""
  dataset = _tfds_features(dataset_name, text2self, tfds_data_dir, dataset_split)
  dataset = encode_all_features(dataset, vocabulary)
  dataset = pack_or_pad(dataset, sequence_length, pack=pack, ensure_eos=True)
  return batch_dataset(dataset, batch_size) if batch_size else dataset
