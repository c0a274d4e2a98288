"""Vocabularies: text <-> token ids, in Python and in TF ops.

Every vocabulary reserves id 0 for padding (PAD) and id 1 for end of sequence (EOS);
decoding stops at the first EOS and drops PAD. `ByteVocabulary`, the default, is plain
TF ops, so an exported SavedModel needs no mesh_tf. `SentencePieceVocabulary` needs the
`sentencepiece` package (extra "text"); `train_sentencepiece` trains a model on the fly.
"""
import glob as glob_lib
import os
import tempfile

import gin
import numpy as np
import tensorflow as tf

from mesh_tf import errors

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2


class Vocabulary:
  """Abstract vocabulary: ids 0 (PAD) and 1 (EOS) are reserved."""

  pad_id = PAD_ID
  eos_id = EOS_ID

  @property
  def vocab_size(self):
    """Number of ids, reserved and extra ids included."""
    raise NotImplementedError

  def encode(self, s):
    """Encodes a Python string into a list of ints (no EOS appended)."""
    raise NotImplementedError

  def decode(self, ids):
    """Decodes ids into a string, stopping at the first EOS and dropping PAD."""
    raise NotImplementedError

  def encode_tf(self, s):
    """Encodes a tf.string scalar into an int32 [n] tensor (no EOS appended)."""
    raise NotImplementedError

  def decode_tf(self, ids):
    """Decodes int32 ids [..., n] into tf.string [...], stopping at EOS, dropping PAD."""
    raise NotImplementedError

  def _ids_before_eos(self, ids):
    """The Python ids up to (not including) the first EOS, without PAD."""
    out = []
    for i in np.asarray(ids).reshape([-1]).tolist():
      if i == self.eos_id:
        break
      if i != self.pad_id:
        out.append(int(i))
    return out


def _as_text(value):
  """A Python str from what tf.numpy_function passes for a tf.string scalar."""
  if isinstance(value, np.ndarray):
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _keep_before_eos(ids, eos_id):
  """Bool mask of the positions of ids [..., n] before the first EOS on the last axis."""
  seen_eos = tf.cumsum(tf.cast(tf.equal(ids, eos_id), tf.int32), axis=-1, exclusive=True)
  return tf.logical_and(tf.equal(seen_eos, 0), tf.not_equal(ids, eos_id))


@gin.configurable(module="vocabulary")
class ByteVocabulary(Vocabulary):
  """UTF-8 bytes shifted by 3 (0 PAD, 1 EOS, 2 UNK), plus `extra_ids` ids at the end.

  Decoding drops ids that are not bytes (UNK and the extra ids) and invalid UTF-8.
  """

  num_reserved_ids = 3

  def __init__(self, extra_ids=0):
    self._extra_ids = int(extra_ids)

  @property
  def vocab_size(self):
    """256 bytes + 3 reserved ids + the extra ids."""
    return 256 + self.num_reserved_ids + self._extra_ids

  @property
  def extra_ids(self):
    """The number of extra ids appended after the byte ids."""
    return self._extra_ids

  def encode(self, s):
    """UTF-8 bytes of s, each shifted by 3."""
    return [b + self.num_reserved_ids for b in s.encode("utf-8")]

  def decode(self, ids):
    """Bytes of the ids before EOS, as UTF-8 text (invalid sequences dropped)."""
    kept = [i - self.num_reserved_ids for i in self._ids_before_eos(ids)
            if self.num_reserved_ids <= i < 256 + self.num_reserved_ids]
    return bytes(kept).decode("utf-8", errors="ignore")

  def encode_tf(self, s):
    """tf.string scalar -> int32 [n] byte ids; pure TF ops."""
    raw = tf.io.decode_raw(tf.convert_to_tensor(s, tf.string), tf.uint8)
    return tf.cast(tf.reshape(raw, [-1]), tf.int32) + self.num_reserved_ids

  def decode_tf(self, ids):
    """int32 ids [..., n] -> tf.string [...]; pure TF ops (usable in a SavedModel)."""
    ids = tf.convert_to_tensor(ids)
    ids = tf.cast(ids, tf.int32)
    squeeze = ids.shape.rank == 1
    if squeeze:
      ids = ids[tf.newaxis]
    keep = tf.logical_and(
        _keep_before_eos(ids, self.eos_id),
        tf.logical_and(ids >= self.num_reserved_ids, ids < 256 + self.num_reserved_ids))
    byte_values = tf.ragged.boolean_mask(ids - self.num_reserved_ids, keep)
    # One single-byte string per byte value; joining them rebuilds the raw bytes.
    byte_strings = tf.constant([bytes([b]) for b in range(256)])
    pieces = tf.ragged.map_flat_values(tf.gather, byte_strings, byte_values)
    text = tf.strings.reduce_join(pieces, axis=-1)
    text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="ignore")
    return text[0] if squeeze else text


def _import_sentencepiece():
  """Imports sentencepiece, or says how to install it."""
  try:
    import sentencepiece  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.MtfError(
        "SentencePieceVocabulary needs the 'sentencepiece' package, which is not "
        "installed", hint="pip install -e .[text]  (or: pip install sentencepiece)") from e
  return sentencepiece


@gin.configurable(module="vocabulary")
class SentencePieceVocabulary(Vocabulary):
  """A SentencePiece model (pad=0, eos=1, unk=2), plus `extra_ids` ids at the end.

  Python encode/decode use the sentencepiece library directly; encode_tf/decode_tf
  call it through tf.numpy_function (fine in tf.data and tf.function; a SavedModel
  that must run without Python should use ByteVocabulary).
  """

  def __init__(self, sentencepiece_model_file=gin.REQUIRED, extra_ids=0):
    spm = _import_sentencepiece()
    self._model_file = sentencepiece_model_file
    if not tf.io.gfile.exists(sentencepiece_model_file):
      raise errors.MtfError(
          "SentencePiece model file %r does not exist" % sentencepiece_model_file,
          file=sentencepiece_model_file,
          hint="give an existing .model file or train one with train_sentencepiece")
    with tf.io.gfile.GFile(sentencepiece_model_file, "rb") as f:
      self._model_proto = f.read()
    self._processor = spm.SentencePieceProcessor()
    try:
      self._processor.LoadFromSerializedProto(self._model_proto)
    except Exception as e:  # sentencepiece raises RuntimeError/OSError variants
      raise errors.MtfError("cannot load SentencePiece model %r: %s"
                            % (sentencepiece_model_file, e),
                            file=sentencepiece_model_file) from e
    if (self._processor.pad_id() != PAD_ID or self._processor.eos_id() != EOS_ID):
      raise errors.MtfError(
          "SentencePiece model %r has pad_id=%d, eos_id=%d; mesh_tf needs pad_id=0 and "
          "eos_id=1" % (sentencepiece_model_file, self._processor.pad_id(),
                        self._processor.eos_id()),
          file=sentencepiece_model_file,
          hint="train it with --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1 "
               "(train_sentencepiece does)")
    self._extra_ids = int(extra_ids)

  @property
  def sentencepiece_model_file(self):
    """Path of the .model file."""
    return self._model_file

  @property
  def vocab_size(self):
    """Pieces of the model + the extra ids."""
    return self._processor.GetPieceSize() + self._extra_ids

  def encode(self, s):
    """Piece ids of s."""
    return list(self._processor.EncodeAsIds(s))

  def decode(self, ids):
    """Text of the ids before EOS (PAD and extra ids dropped)."""
    piece_size = self._processor.GetPieceSize()
    kept = [i for i in self._ids_before_eos(ids) if i < piece_size]
    return self._processor.DecodeIds(kept)

  def encode_tf(self, s):
    """tf.string scalar -> int32 [n], through tf.numpy_function."""
    def encode_np(text):
      return np.asarray(self.encode(_as_text(text)), np.int32)
    ids = tf.numpy_function(encode_np, [tf.convert_to_tensor(s, tf.string)], tf.int32,
                            stateful=False)
    return tf.reshape(ids, [-1])

  def decode_tf(self, ids):
    """int32 ids [..., n] -> tf.string [...], through tf.numpy_function."""
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    def decode_np(id_array):
      rows = id_array.reshape([-1, id_array.shape[-1]])
      texts = [self.decode(row).encode("utf-8") for row in rows]
      return np.asarray(texts, dtype=object).reshape(id_array.shape[:-1])
    text = tf.numpy_function(decode_np, [ids], tf.string, stateful=False)
    return tf.reshape(text, tf.shape(ids)[:-1])


def _text_lines(text_iterator_or_files):
  """Yields text: a str is a file glob; a list/tuple of names of existing files (or
  globs) is read; any other iterable (or a list of non-file strings) is the text."""
  if isinstance(text_iterator_or_files, str):
    paths = sorted(glob_lib.glob(text_iterator_or_files))
    if not paths:
      raise errors.MtfError("train_sentencepiece: no file matches %r"
                            % text_iterator_or_files, file=text_iterator_or_files)
    text_iterator_or_files = paths
  items = list(text_iterator_or_files)
  matches = [sorted(glob_lib.glob(item)) if isinstance(item, str) and "\n" not in item
             else [] for item in items]
  if items and all(matches):
    for paths in matches:
      for path in paths:
        with open(path, encoding="utf-8") as f:
          yield f.read()
    return
  for item in items:
    yield item.decode("utf-8") if isinstance(item, bytes) else str(item)


def train_sentencepiece(text_iterator_or_files, vocab_size, model_prefix=None,
                        model_type="unigram", character_coverage=1.0,
                        max_sentence_length=4192, extra_options=None):
  """Trains a SentencePiece model (pad=0, eos=1, unk=2, no bos); returns its .model path.

  text_iterator_or_files: file paths/globs, or an iterable of text strings.
  vocab_size counts the reserved ids. model_prefix: where <prefix>.model and
  <prefix>.vocab go (default: a new temporary directory). max_sentence_length: longest
  input line in bytes (longer ones are skipped). extra_options: further sentencepiece
  trainer options.
  """
  spm = _import_sentencepiece()
  if model_prefix is None:
    model_prefix = os.path.join(tempfile.mkdtemp(prefix="spm_"), "spm")
  lines = []
  for text in _text_lines(text_iterator_or_files):
    lines.extend(line for line in text.splitlines() if line.strip())
  if not lines:
    raise errors.MtfError("train_sentencepiece got no text to train on")
  options = dict(model_prefix=model_prefix, vocab_size=int(vocab_size),
                 model_type=model_type, character_coverage=character_coverage,
                 pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
                 max_sentence_length=max_sentence_length,
                 hard_vocab_limit=False, minloglevel=2)
  options.update(extra_options or {})
  try:
    spm.SentencePieceTrainer.Train(sentence_iterator=iter(lines), **options)
  except RuntimeError as e:
    raise errors.MtfError("SentencePiece training for %r failed: %s"
                          % (model_prefix, e), file=model_prefix) from e
  return model_prefix + ".model"


@gin.configurable(module="vocabulary")
def trained_sentencepiece_vocabulary(vocab_size=1024, text_glob=None, model_prefix=None,
                                     model_type="unigram", extra_ids=0):
  """A SentencePieceVocabulary trained on the fly on the files matching text_glob (None:
  the embedded default corpus); an existing <model_prefix>.model is reused."""
  if model_prefix and tf.io.gfile.exists(model_prefix + ".model"):
    return SentencePieceVocabulary(model_prefix + ".model", extra_ids=extra_ids)
  if text_glob is None:
    from models.transformer import default_corpus  # pylint: disable=g-import-not-at-top
    source = [default_corpus.default_corpus_text()]
  else:
    source = text_glob  # a str is a glob: no match raises, naming it
  path = train_sentencepiece(source, vocab_size, model_prefix=model_prefix,
                             model_type=model_type)
  return SentencePieceVocabulary(path, extra_ids=extra_ids)


class _NumpyFunctionVocabulary(Vocabulary):
  """A Vocabulary whose TF ops run its Python encode/decode on one string through
  tf.numpy_function."""

  def encode_tf(self, s):
    """tf.string scalar -> int32 [n], through tf.numpy_function."""
    def encode_np(text):
      return np.asarray(self.encode(_as_text(text)), np.int32)
    return tf.reshape(tf.numpy_function(encode_np, [s], tf.int32, stateful=False), [-1])

  def decode_tf(self, ids):
    """int32 ids [n] -> tf.string scalar, through tf.numpy_function."""
    def decode_np(id_array):
      return np.asarray(self.decode(id_array).encode("utf-8"), dtype=object)
    return tf.reshape(tf.numpy_function(decode_np, [ids], tf.string, stateful=False), [])


class TFDSVocabulary(_NumpyFunctionVocabulary):
  """Wraps a TFDS text encoder (tfds.deprecated.text), its id k shifted to k + 1 so that
  1 is free for EOS (TFDS encoders use 0 for padding and have no EOS)."""

  def __init__(self, tfds_encoder):
    self._encoder = tfds_encoder

  @property
  def vocab_size(self):
    """Encoder ids + 1 (for EOS)."""
    return self._encoder.vocab_size + 1

  def encode(self, s):
    """Encoder ids of s, shifted by 1."""
    return [i + 1 for i in self._encoder.encode(s)]

  def decode(self, ids):
    """Text of the ids before EOS."""
    return self._encoder.decode([i - 1 for i in self._ids_before_eos(ids)])


@gin.configurable(module="vocabulary")
def get_tfds_vocabulary(dataset_name=gin.REQUIRED, tfds_data_dir=None):
  """The text encoder of an on-disk TFDS dataset's targets feature (nothing is
  downloaded: the dataset must be prepared under tfds_data_dir)."""
  from models.transformer import tfds_loading  # pylint: disable=g-import-not-at-top
  builder = tfds_loading.on_disk_builder(dataset_name, tfds_data_dir)
  info = builder.info
  key = info.supervised_keys[1] if info.supervised_keys else "text"
  encoder = getattr(info.features[key], "encoder", None)
  if encoder is None:
    raise errors.MtfError(
        "TFDS dataset %r feature %r has no text encoder (it is not pretokenized)"
        % (dataset_name, key), hint="use ByteVocabulary or SentencePieceVocabulary")
  return TFDSVocabulary(encoder)
