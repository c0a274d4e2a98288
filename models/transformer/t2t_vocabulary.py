"""`T2tVocabulary`: the subword vocabularies of tensor2tensor (SubwordTextEncoder files,
e.g. "vocab.translate_ende_wmt32k.32768.subwords"), read and applied without
tensor2tensor.

A vocabulary file holds one subtoken per line, usually in single quotes; its first
lines are the reserved "<pad>" (id 0) and "<EOS>" (id 1). Text is cut into tokens where
the characters switch between alphanumeric (Unicode letters and digits) and the rest,
dropping the single spaces between two alphanumeric tokens. Each token is escaped
("\\" -> "\\\\", "_" -> "\\u", characters outside the vocabulary's alphabet -> "\\<code
point>;") and ends with "_"; it is then split greedily into the longest subtokens of the
file. Decoding joins the subtokens, splits at the "_" ends, unescapes, and puts a space
back between adjacent alphanumeric tokens.
"""
import os
import re
import unicodedata

import gin
import numpy as np
import tensorflow as tf

from mesh_tf import errors
from models.transformer.vocabulary import Vocabulary, _as_text

_ESCAPE_CHARS = set("\\_u;0123456789")
_UNESCAPE = re.compile(r"\\u|\\\\|\\([0-9]+);")


def _is_alphanumeric(c):
  return unicodedata.category(c)[0] in ("L", "N")


def split_tokens(text):
  """Text cut where alphanumeric and other characters meet; single spaces between two
  alphanumeric tokens are dropped (they come back on decoding)."""
  if not text:
    return []
  tokens = []
  start = 0
  for pos in range(1, len(text)):
    if _is_alphanumeric(text[pos]) != _is_alphanumeric(text[pos - 1]):
      token = text[start:pos]
      if token != " " or start == 0:
        tokens.append(token)
      start = pos
  tokens.append(text[start:])
  return tokens


def join_tokens(tokens):
  """The inverse of split_tokens: a space between adjacent alphanumeric tokens."""
  out = []
  for i, token in enumerate(tokens):
    if i and _is_alphanumeric(tokens[i - 1][0]) and _is_alphanumeric(token[0]):
      out.append(" ")
    out.append(token)
  return "".join(out)


def _read_subtokens(filepath):
  if not tf.io.gfile.exists(filepath):
    raise errors.MtfError("T2tVocabulary: no vocabulary file %r" % filepath,
                          hint="give data_dir and vocabulary_filename of a T2T "
                          "SubwordTextEncoder file")
  subtokens = []
  with tf.io.gfile.GFile(filepath, "r") as f:
    for line in f:
      s = line.rstrip("\r\n").strip()
      if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        s = s[1:-1]
      subtokens.append(s)
  if len(subtokens) < 2:
    raise errors.MtfError("T2tVocabulary: %r has %d lines; a T2T vocabulary starts with "
                          "<pad> and <EOS>" % (filepath, len(subtokens)))
  return subtokens


class T2tVocabulary(Vocabulary):
  """A tensor2tensor SubwordTextEncoder vocabulary file (see the module docstring)."""

  def __init__(self, filepath):
    self._filepath = filepath
    self._subtokens = _read_subtokens(filepath)
    self._ids = {s: i for i, s in enumerate(self._subtokens) if s}
    self._max_length = max(len(s) for s in self._subtokens)
    self._alphabet = {c for s in self._subtokens for c in s} | _ESCAPE_CHARS

  @property
  def vocab_size(self):
    """The number of subtokens in the file (reserved ones included)."""
    return len(self._subtokens)

  def _escape(self, token):
    token = token.replace("\\", "\\\\").replace("_", "\\u")
    return "".join(c if c in self._alphabet and c != "\n" else "\\%d;" % ord(c)
                   for c in token) + "_"

  def _subtoken_ids(self, escaped):
    ids = []
    start = 0
    while start < len(escaped):
      for end in range(min(len(escaped), start + self._max_length), start, -1):
        piece = escaped[start:end]
        if piece in self._ids:
          ids.append(self._ids[piece])
          start = end
          break
      else:
        raise errors.MtfError("T2tVocabulary %r: no subtoken covers %r (the file lacks "
                              "single characters of its alphabet)" % (
                                  self._filepath, escaped[start:]))
    return ids

  def encode(self, s):
    """Subtoken ids of the text s (no EOS)."""
    ids = []
    for token in split_tokens(s):
      ids.extend(self._subtoken_ids(self._escape(token)))
    return ids

  @staticmethod
  def _unescape(escaped):
    def replace(match):
      if match.group(1) is None:
        return "_" if match.group(0) == "\\u" else "\\"
      try:
        return chr(int(match.group(1)))
      except (ValueError, OverflowError):
        return "\u3013"
    return _UNESCAPE.sub(replace, escaped)

  def decode(self, ids):
    """The text of the ids before the first EOS (PAD dropped)."""
    pieces = [self._subtokens[i] if 0 <= i < len(self._subtokens) else ""
              for i in self._ids_before_eos(ids)]
    tokens = [self._unescape(t) for t in "".join(pieces).split("_") if t]
    return join_tokens([t for t in tokens if t])

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


@gin.configurable(module="t2t_vocabulary")
def get_t2t_vocabulary(data_dir=gin.REQUIRED, vocabulary_filename=gin.REQUIRED):
  """The T2tVocabulary of data_dir/vocabulary_filename."""
  return T2tVocabulary(os.path.join(data_dir, vocabulary_filename))
