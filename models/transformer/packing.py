"""Fixed-length examples for tf.data: packing, trimming and padding, EOS handling.

`pack_dataset` packs examples into rows greedily and in order (an example joins the
current row when every packed feature fits in the room left), as a streaming `tf.data`
scan without custom ops. `pack_in_memory` packs examples held in memory by the same
rule, once, in NumPy: the scan's per-example ops cost about 0.3 ms of CPU per row, which
a small model's train step pays every step (and every process of an SPMD run).
"""
import gin
import numpy as np
import tensorflow as tf

from mesh_tf import errors

EOS_ID = 1


def lengths_per_key(length, keys):
  """{key: length} from an int (same for all keys) or a dict naming every key."""
  if isinstance(length, dict):
    missing = [k for k in keys if k not in length]
    if missing:
      raise errors.MtfError("sequence_length %r has no length for feature(s) %s"
                            % (length, ", ".join(missing)))
    return {k: int(length[k]) for k in keys}
  return {k: int(length) for k in keys}


def _feature_keys(dataset, feature_keys):
  """The requested keys that the dataset has (all its keys when None)."""
  spec = dataset.element_spec
  if not isinstance(spec, dict):
    raise errors.MtfError("expected a dataset of feature dicts, got element spec %r"
                          % (spec,))
  if feature_keys is None:
    return list(spec.keys())
  unknown = [k for k in feature_keys if k not in spec]
  if unknown:
    raise errors.MtfError("feature(s) %s not in the dataset (it has %s)"
                          % (", ".join(unknown), ", ".join(spec.keys())))
  return list(feature_keys)


def trim_and_pad_to_length(x, length):
  """x[:length] padded with 0 to exactly `length` along its first axis (any rank >= 1:
  on a batched feature this trims or pads the batch)."""
  x = x[:length]
  pad = [[0, length - tf.shape(x)[0]]] + [[0, 0]] * (x.shape.rank - 1)
  x = tf.pad(x, pad)
  return tf.ensure_shape(x, [length] + x.shape.as_list()[1:])


def trim_and_pad_dataset(dataset, length, feature_keys=None):
  """Cuts each listed feature to `length` (int or {key: n}) along its first axis and
  pads it with 0; features not listed pass through unchanged. On a batched dataset
  this pads the batch dimension (e.g. a short last eval batch)."""
  keys = _feature_keys(dataset, feature_keys)
  lengths = lengths_per_key(length, keys)

  def trim_and_pad(features):
    return {k: trim_and_pad_to_length(v, lengths[k]) if k in lengths else v
            for k, v in features.items()}
  return dataset.map(trim_and_pad, num_parallel_calls=tf.data.AUTOTUNE)


def ensure_dataset_eos(dataset, feature_keys=None):
  """On fixed-length features, turns a final non-PAD token (a cut row's) into EOS."""
  keys = _feature_keys(dataset, feature_keys)

  def ensure_eos(features):
    out = dict(features)
    for k in keys:
      v = features[k]
      last = tf.minimum(v[-1:], tf.cast(EOS_ID, v.dtype))
      out[k] = tf.concat([v[:-1], last], axis=0)
    return out
  return dataset.map(ensure_eos, num_parallel_calls=tf.data.AUTOTUNE)


def _trim_keeping_eos(dataset, lengths):
  """Cuts examples longer than the length, putting EOS in the last kept position."""
  def trim(features):
    out = dict(features)
    for k, n in lengths.items():
      v = features[k]
      cut = tf.size(v) > n
      v = v[:n]
      eos = tf.cast(EOS_ID, v.dtype)
      out[k] = tf.cond(cut, lambda v=v, eos=eos: tf.concat([v[:-1], [eos]], 0),
                       lambda v=v: v)
    return out
  return dataset.map(trim, num_parallel_calls=tf.data.AUTOTUNE)


@gin.configurable(module="dataset")
def pack_dataset(dataset, length, keys=None, use_custom_ops=False):
  """Greedily packs examples into rows of `length` tokens (int or {key: n}).

  dataset: unbatched dicts of 1-D integer features; keys: those to pack (default: all;
  others are dropped). use_custom_ops, the original's switch to its C++ ops, changes
  nothing. Returns dicts of `k`, `k_segmentation` (1, 2, ... for a row's examples, 0 on
  padding) and `k_position` (0, 1, ... within each example) for each key k. Longer
  examples are cut; examples empty in every key are dropped.
  """
  if not isinstance(use_custom_ops, bool):
    raise errors.MtfError("pack_dataset: use_custom_ops must be True or False, got %r"
                          % (use_custom_ops,))
  keys = _feature_keys(dataset, keys)
  lengths = lengths_per_key(length, keys)
  spec = dataset.element_spec
  dtypes = {k: spec[k].dtype for k in keys}
  trimmed = dataset.map(lambda ex: {k: tf.reshape(ex[k], [-1])[:lengths[k]]
                                    for k in keys})
  trimmed = trimmed.filter(
      lambda ex: tf.reduce_any(tf.stack([tf.size(ex[k]) > 0 for k in keys])))
  # A final empty example marked `flush` makes the scan emit the last partial row.
  flush = {k: tf.zeros([0], dtypes[k]) for k in keys}
  marked = trimmed.map(lambda ex: (ex, False)).concatenate(
      tf.data.Dataset.from_tensors((flush, True)))

  def empty_row():
    row = {}
    for k in keys:
      row[k] = tf.zeros([lengths[k]], dtypes[k])
      row[k + "_segmentation"] = tf.zeros([lengths[k]], tf.int32)
      row[k + "_position"] = tf.zeros([lengths[k]], tf.int32)
    return row

  initial_state = (empty_row(), {k: tf.constant(0) for k in keys}, tf.constant(0))

  def step(state, element):
    row, used, num_segments = state
    example, is_flush = element
    sizes = {k: tf.size(example[k]) for k in keys}
    fits = tf.reduce_all(tf.stack([used[k] + sizes[k] <= lengths[k] for k in keys]))
    fits = tf.logical_and(fits, num_segments > 0)
    emit = tf.logical_and(num_segments > 0,
                          tf.logical_or(is_flush, tf.logical_not(fits)))
    # The row the example goes into: the current one, or a fresh empty one.
    keep = tf.cast(fits, tf.int32)
    segment = num_segments * keep + 1
    new_row, new_used = {}, {}
    for k in keys:
      start = used[k] * keep
      room_after = lengths[k] - start - sizes[k]
      def place(values, start=start, room_after=room_after):
        return tf.pad(values, [[start, room_after]])
      new_row[k] = row[k] * tf.cast(keep, dtypes[k]) + place(example[k])
      new_row[k + "_segmentation"] = (row[k + "_segmentation"] * keep +
                                      place(tf.fill([sizes[k]], segment)))
      new_row[k + "_position"] = (row[k + "_position"] * keep +
                                  place(tf.range(sizes[k], dtype=tf.int32)))
      new_used[k] = start + sizes[k]
    return (new_row, new_used, segment), (emit, row)

  scanned = marked.scan(initial_state, step)
  packed = scanned.filter(lambda emit, row: emit).map(lambda emit, row: row)

  row_lengths = {}
  for k in keys:
    for name in (k, k + "_segmentation", k + "_position"):
      row_lengths[name] = lengths[k]

  def set_shapes(row):
    return {name: tf.ensure_shape(v, [row_lengths[name]]) for name, v in row.items()}
  return packed.map(set_shapes)


def pack_in_memory(examples, length, dtypes):
  """pack_dataset's rows, as a tf.data.Dataset, of examples held in memory.

  examples: a list of {key: 1-D integer sequence} (every key of `dtypes`); length: int
  or {key: n}; dtypes: {key: the tf dtype of its values}.
  """
  keys = list(dtypes)
  lengths = lengths_per_key(length, keys)
  rows = {name: [] for k in keys for name in (k, k + "_segmentation", k + "_position")}
  row, used, segments = None, None, 0

  def emit():
    for k in keys:
      for name, values in zip((k, k + "_segmentation", k + "_position"), row[k]):
        rows[name].append(values)

  for example in examples:
    pieces = {k: np.asarray(example[k]).reshape([-1])[:lengths[k]] for k in keys}
    if not any(p.size for p in pieces.values()):
      continue  # empty in every key: dropped
    fits = segments > 0 and all(used[k] + pieces[k].size <= lengths[k] for k in keys)
    if not fits:
      if segments:
        emit()
      row = {k: [np.zeros([lengths[k]], np.int64) for _ in range(3)] for k in keys}
      used, segments = {k: 0 for k in keys}, 0
    segments += 1
    for k in keys:
      begin, end = used[k], used[k] + pieces[k].size
      values, segmentation, position = row[k]
      values[begin:end] = pieces[k]
      segmentation[begin:end] = segments
      position[begin:end] = np.arange(pieces[k].size)
      used[k] = end
  if segments:
    emit()
  columns = {}
  for k in keys:
    for name, dtype in ((k, dtypes[k]), (k + "_segmentation", tf.int32),
                        (k + "_position", tf.int32)):
      stacked = (np.stack(rows[name]) if rows[name]
                 else np.zeros([0, lengths[k]], np.int64))
      columns[name] = tf.constant(stacked, dtype)
  return tf.data.Dataset.from_tensor_slices(columns)


def pack_or_pad(dataset, length, pack=True, feature_keys=None, ensure_eos=False):
  """Makes fixed-length rows by packing (pack=True) or by trimming and padding.

  Args:
    dataset: unbatched dataset of dicts of 1-D integer features.
    length: an int, or a dict {key: length}.
    pack: pack several examples per row (adds *_segmentation / *_position).
    feature_keys: the features to pack, or to trim and pad (default: all). Packing
      keeps only these; without packing, other features pass through unchanged (as
      in the original, e.g. "inputs_pretokenized" strings).
    ensure_eos: examples cut at the length end in EOS instead of a mid-text token.
  Returns:
    an unbatched dataset of fixed-length features.
  """
  keys = _feature_keys(dataset, feature_keys)
  lengths = lengths_per_key(length, keys)
  if ensure_eos:
    dataset = _trim_keeping_eos(dataset, lengths)
  if pack:
    dataset = dataset.map(lambda ex: {k: ex[k] for k in keys})
    return pack_dataset(dataset, lengths, keys)
  return trim_and_pad_dataset(dataset, lengths, keys)
