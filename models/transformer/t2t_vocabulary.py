"""Tensor2tensor subword vocabularies (the original's transformer/t2t_vocabulary.py),
read without tensor2tensor.

A t2t `*.subwords` file lists one subtoken per line, quoted ('the_'); a subtoken's id
is its line number (the files start with '<pad>' and '<EOS>', ids 0 and 1). Text is
split into runs of letters/digits and runs of other characters (a single space between
two words is implied); each token is escaped ("\\" -> "\\\\", "_" -> "\\u", characters
outside the vocabulary's alphabet -> "\\<code point>;"), ends in "_", and is cut greedily
into the longest subtokens of the file. Decoding reverses this. Encodings match the ids
of tensor2tensor's SubwordTextEncoder for the same file.
"""
import os
import re
import unicodedata

import gin
import tensorflow as tf

from mesh_tf import errors
from models.transformer import vocabulary as vocabulary_lib

_ESCAPE_CHARS = set("\\_u;0123456789")
_UNESCAPE = re.compile(r"\\u|\\\\|\\([0-9]+);")


def _is_alnum(char):
  return unicodedata.category(char)[0] in ("L", "N")


def split_tokens(text):
  """Runs of letters/digits and runs of other characters; a lone space between two
  runs is dropped (decoding puts it back between two word runs)."""
  if not text:
    return []
  tokens, start = [], 0
  for pos in range(1, len(text)):
    if _is_alnum(text[pos]) != _is_alnum(text[pos - 1]):
      token = text[start:pos]
      if token != " " or start == 0:
        tokens.append(token)
      start = pos
  tokens.append(text[start:])
  return tokens


def join_tokens(tokens):
  """The text of tokens: a space between two consecutive word runs."""
  out = []
  for i, token in enumerate(tokens):
    if i and _is_alnum(tokens[i - 1][0]) and _is_alnum(token[0]):
      out.append(" ")
    out.append(token)
  return "".join(out)


def _unescape(escaped):
  def replace(match):
    if match.group(1) is None:
      return "_" if match.group(0) == "\\u" else "\\"
    try:
      return chr(int(match.group(1)))
    except (ValueError, OverflowError):
      return "\u3013"  # the "undefined character" mark
  return _UNESCAPE.sub(replace, escaped)


class T2tVocabulary(vocabulary_lib._NumpyFunctionVocabulary):  # pylint: disable=protected-access
  """A tensor2tensor SubwordTextEncoder vocabulary file (`filepath`)."""

  def __init__(self, filepath):
    if not tf.io.gfile.exists(filepath):
      raise errors.MtfError("t2t vocabulary file %s does not exist" % filepath,
                            file=filepath)
    subtokens = []
    with tf.io.gfile.GFile(filepath) as f:
      for line in f:
        s = line.rstrip("\r\n")
        if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
          s = s[1:-1]
        subtokens.append(s)
    self._filepath = filepath
    self._subtokens = subtokens
    self._ids = {s: i for i, s in enumerate(subtokens) if s}
    self._max_len = max([len(s) for s in subtokens] + [1])
    self._alphabet = {c for s in subtokens for c in s} | _ESCAPE_CHARS
    self._cache = {}

  @property
  def vocab_size(self):
    """The number of subtokens in the file (reserved ones included)."""
    return len(self._subtokens)

  def _escape(self, token):
    token = token.replace("\\", "\\\\").replace("_", "\\u")
    return "".join(c if c in self._alphabet and c != "\n" else "\\%d;" % ord(c)
                   for c in token) + "_"

  def _token_ids(self, token):
    if token in self._cache:
      return self._cache[token]
    escaped, ids, start = self._escape(token), [], 0
    while start < len(escaped):
      for end in range(min(len(escaped), start + self._max_len), start, -1):
        piece = escaped[start:end]
        if piece in self._ids:
          ids.append(self._ids[piece])
          start = end
          break
      else:
        raise errors.MtfError(
            "t2t vocabulary %s cannot spell %r (no subtoken for %r)"
            % (self._filepath, token, escaped[start]), file=self._filepath)
    self._cache[token] = ids
    return ids

  def encode(self, s):
    """Subtoken ids of the text (no EOS appended)."""
    text = vocabulary_lib._as_text(s)  # pylint: disable=protected-access
    return [i for token in split_tokens(text) for i in self._token_ids(token)]

  def decode(self, ids):
    """The text of ids, up to the first EOS, PAD dropped."""
    ids = self._ids_before_eos(ids)
    joined = "".join(self._subtokens[i] if 0 <= i < len(self._subtokens) else ""
                     for i in ids)
    tokens = [_unescape(t) for t in joined.split("_") if t]
    return join_tokens([t for t in tokens if t])


@gin.configurable(module="t2t_vocabulary")
def get_t2t_vocabulary(data_dir=gin.REQUIRED, vocabulary_filename=gin.REQUIRED):
  """The T2tVocabulary of `<data_dir>/<vocabulary_filename>`."""
  return T2tVocabulary(os.path.join(data_dir, vocabulary_filename))

