"""What a checkpoint's weights mean beyond their shapes: the vocabulary and the model's
hyperparameters, recorded in every checkpoint the trainer writes and checked on load.

Shapes alone do not pin a model down: attention weights store heads and d_kv combined
(`num_heads=8, d_kv=8` reads a `num_heads=4, d_kv=16` checkpoint), and another
vocabulary may pad to the same vocab dim. So the record (inside the checkpoint, under
mtf.checkpoint.RECORD_KEY) holds the vocabulary and each variable's shapes, including
those the model reshapes it to. Checkpoints without a record load unchecked.
"""
import contextlib
import hashlib
import json

import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.checkpoint import files as checkpoint_files
from mesh_tf.checkpoint import record as record_lib
from mesh_tf.errors import CheckpointError

_FORMAT = 1
_FILE_ATTRIBUTES = ("sentencepiece_model_file", "_filepath", "filepath", "vocab_file",
                    "_vocab_file", "vocabulary_file")
_state = {"active": None}


def _sha256(data):
  return hashlib.sha256(data).hexdigest()


def _model_file_hash(vocabulary):
  """sha256 of the vocabulary's model file (its bytes), or None if it has none."""
  proto = getattr(vocabulary, "_model_proto", None)  # SentencePiece keeps the bytes
  if isinstance(proto, bytes):
    return _sha256(proto)
  for name in _FILE_ATTRIBUTES:
    path = getattr(vocabulary, name, None)
    if isinstance(path, str) and path and tf.io.gfile.exists(path):
      with tf.io.gfile.GFile(path, "rb") as f:
        return _sha256(f.read())
  return None


def vocabulary_record(vocabulary):
  """{setting: value} of a vocabulary: "type", "size" and, where it has a model file,
  "model_sha256"; an (inputs, targets) pair's keys are prefixed "inputs "/"targets "."""
  from models.transformer.trainer import decode_io  # pylint: disable=g-import-not-at-top
  if isinstance(vocabulary, tuple):
    return {"%s %s" % (role, k): value for role, v in zip(("inputs", "targets"), vocabulary)
            for k, value in vocabulary_record(v).items()}
  record = {"type": type(vocabulary).__name__,
            "size": str(decode_io.vocab_size(vocabulary))}
  digest = _model_file_hash(vocabulary)
  if digest:
    record["model_sha256"] = digest
  return record


def _shape_text(shape):
  return ",".join("%s=%d" % (d.name, d.size) for d in shape.dims)


def model_record(graph):
  """{variable name: shapes} of an mtf.Graph's trainable variables: the stored mtf
  shape, then "; " and each shape the graph reshapes it to (e.g. q
  "d_model=16,heads=16; d_model=16,heads=4,d_kv=4")."""
  views = {}
  for op in graph.operations:
    if isinstance(op, mtf.ReshapeOperation) and op.inputs:
      source = op.inputs[0].operation
      if isinstance(source, mtf.Variable):
        views.setdefault(source.name, set()).add(_shape_text(op.outputs[0].shape))
  record = {}
  for variable in graph.trainable_variables:
    shapes = [_shape_text(variable.outputs[0].shape)] + sorted(views.get(variable.name, []))
    names = getattr(variable, "checkpoint_split", None)
    if names:  # stored as one variable per entry of its first dim (pipeline stages)
      dims = variable.outputs[0].shape.dims
      first = _shape_text(mtf.Shape(dims[:1])) + ","
      shapes = [_shape_text(mtf.Shape(dims[1:]))] + [
          v[len(first):] if v.startswith(first) else v for v in shapes[1:]]
    for name in names or [variable.name]:
      record[name] = "; ".join(shapes)
  return record


def record_text(vocabulary_settings, model_settings):
  """The record stored in checkpoints (JSON) of the two records."""
  return json.dumps({"format": _FORMAT, "vocabulary": vocabulary_settings,
                     "model": model_settings}, sort_keys=True)


@contextlib.contextmanager
def expecting(vocabulary_settings, model_settings, allow_mismatch=False):
  """Within: checkpoints saved by the trainer carry this record and checkpoints loaded
  are checked against it (allow_mismatch: a mismatch only warns)."""
  previous = _state["active"]
  _state["active"] = (vocabulary_settings, model_settings, bool(allow_mismatch))
  try:
    yield
  finally:
    _state["active"] = previous


def active_text():
  """The active record's text (what CheckpointManager saves), or None outside
  `expecting`."""
  if _state["active"] is None:
    return None
  return record_text(*_state["active"][:2])


def _parse_shapes(text):
  return [[tuple(part.split("=")) for part in shape.split(",") if part]
          for shape in text.split("; ")]


def _dims_text(dims):
  return ", ".join("%s=%s" % d for d in dims) or "[]"


def _model_difference(stored, here):
  """(setting, stored value, value here) of the first difference, or None. Variables
  only this model has are left to restoring, which names the first one missing."""
  for name in sorted(set(stored) & set(here)):
    if stored[name] == here[name]:
      continue
    setting = "model hyperparameters (shape of variable %r)" % name
    for a, b in zip(_parse_shapes(stored[name]), _parse_shapes(here[name])):
      if a == b:
        continue
      if [n for n, _ in a] == [n for n, _ in b]:  # same dims: name the sizes that differ
        differ = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        a, b = [a[i] for i in differ], [b[i] for i in differ]
      return setting, _dims_text(a), _dims_text(b)
    return setting, stored[name], here[name]
  only_stored = sorted(set(stored) - set(here))
  if only_stored:  # restoring would leave them out without a word
    return ("model variables (%d, e.g. %r, which this model lacks)"
            % (len(only_stored), only_stored[0]), "%d" % len(stored), "%d" % len(here))
  return None


def _vocabulary_difference(stored, here):
  order = ["type", "size", "model_sha256"]
  keys = sorted(set(stored) | set(here), key=lambda k: (
      order.index(k.split(" ")[-1]) if k.split(" ")[-1] in order else len(order), k))
  for key in keys:
    if stored.get(key) != here.get(key):
      return ("vocabulary %s" % key, stored.get(key, "(none)"), here.get(key, "(none)"))
  return None


def difference(stored_text, vocabulary_settings, model_settings):
  """(setting, value in the checkpoint, value here) of the first setting in which a
  stored record differs from these records, or None when they agree."""
  stored = json.loads(stored_text)
  return (_vocabulary_difference(stored.get("vocabulary", {}), vocabulary_settings) or
          _model_difference(stored.get("model", {}), model_settings))


def check_checkpoint(path):
  """Checks the checkpoint at path (a prefix or a directory) against the active record;
  returns the prefix checked. A mismatch is a CheckpointError, or a "warning:" line when
  allowed. Nothing is checked outside `expecting`, without a record, or for a
  checkpoint that cannot be read (restoring it reports that)."""
  if _state["active"] is None or path is None:
    return None
  vocabulary_settings, model_settings, allow = _state["active"]
  try:
    prefix, stored = record_lib.read_record(path)
  except CheckpointError:
    return None
  if stored is None:
    return prefix
  try:
    found = difference(stored, vocabulary_settings, model_settings)
  except (ValueError, TypeError, AttributeError):
    print("warning: checkpoint %s has an unreadable %s entry; not checked against this "
          "configuration" % (prefix, record_lib.RECORD_KEY), flush=True)
    return prefix
  if found is None:
    return prefix
  setting, there, here = found
  where = checkpoint_files.index_file(prefix)
  message = ("checkpoint %s was written with %s %s, but this run has %s"
             % (where, setting, there, here))
  if allow:
    print("warning: %s; loading it anyway (utils.run.allow_checkpoint_mismatch)"
          % message, flush=True)
    return prefix
  raise CheckpointError(
      message, file=where,
      hint="use the vocabulary and model configuration that wrote it, or bind "
           "utils.run.allow_checkpoint_mismatch = True to load it anyway")


def restore(path, target, **kwargs):
  """mtf.restore_checkpoint(path, target, **kwargs) after check_checkpoint (again if the
  checkpoint checked was pruned meanwhile and another one restored)."""
  checked = check_checkpoint(path)
  restored = mtf.restore_checkpoint(path, target, **kwargs)
  if _state["active"] is not None and restored.path != checked:
    check_checkpoint(restored.path)
  return restored
