"""Input pipelines: packing against a pure-Python packer, padding, text files, TFDS."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import dataset
from models.transformer import packing
from models.transformer import vocabulary

BYTES = vocabulary.ByteVocabulary()


def _dataset_of(examples, dtypes):
  signature = {k: tf.TensorSpec([None], dtypes[k]) for k in dtypes}
  return tf.data.Dataset.from_generator(lambda: iter(examples),
                                        output_signature=signature)


def _python_pack(examples, lengths):
  """Independent greedy packer: the same rows pack_dataset must produce."""
  keys = sorted(lengths)
  rows, current = [], None
  for ex in examples:
    ex = {k: list(ex[k][:lengths[k]]) for k in keys}
    if not any(ex[k] for k in keys):
      continue
    if current is not None and all(len(current[k]) + len(ex[k]) <= lengths[k]
                                   for k in keys):
      segment = current["n"] + 1
    else:
      if current is not None:
        rows.append(current)
      current = {"n": 0}
      for k in keys:
        current[k], current[k + "_segmentation"], current[k + "_position"] = [], [], []
      segment = 1
    current["n"] = segment
    for k in keys:
      current[k] += ex[k]
      current[k + "_segmentation"] += [segment] * len(ex[k])
      current[k + "_position"] += list(range(len(ex[k])))
  if current is not None:
    rows.append(current)
  padded = []
  for row in rows:
    out = {}
    for k in keys:
      for name in (k, k + "_segmentation", k + "_position"):
        out[name] = row[name] + [0] * (lengths[k] - len(row[name]))
    padded.append(out)
  return padded


def _random_examples(seed):
  """40 two-key examples of random lengths (some empty, some longer than a row)."""
  rng = np.random.RandomState(seed)
  return [{"inputs": rng.randint(2, 50, size=rng.randint(0, 15)).astype(np.int32),
           "targets": rng.randint(2, 50, size=rng.randint(0, 11)).astype(np.int64)}
          for _ in range(40)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pack_dataset_matches_python_packer(seed):
  lengths = {"inputs": 12, "targets": 9}
  examples = _random_examples(seed)
  ds = _dataset_of(examples, {"inputs": tf.int32, "targets": tf.int64})
  got = list(dataset.pack_dataset(ds, lengths).as_numpy_iterator())
  want = _python_pack(examples, lengths)
  assert len(got) == len(want) > 5
  for g, w in zip(got, want):
    assert sorted(g) == sorted(w)
    for name in w:
      np.testing.assert_array_equal(g[name], w[name], err_msg=name)
    assert g["targets"].dtype == np.int64 and g["targets_position"].dtype == np.int32
  # No token lost or duplicated (after the per-example cut at the row length).
  for key in lengths:
    kept = sorted(t for ex in examples for t in ex[key][:lengths[key]])
    packed = sorted(t for row in got for t in row[key] if t != 0)
    assert kept == packed


@pytest.mark.parametrize("seed", [0, 1])
def test_pack_in_memory_gives_the_streaming_packers_rows(seed):
  lengths = {"inputs": 12, "targets": 9}
  examples = _random_examples(seed)
  dtypes = {"inputs": tf.int32, "targets": tf.int64}
  got = list(packing.pack_in_memory(examples, lengths, dtypes).as_numpy_iterator())
  streamed = list(dataset.pack_dataset(_dataset_of(examples, dtypes), lengths)
                  .as_numpy_iterator())
  assert len(got) == len(streamed) == len(_python_pack(examples, lengths)) > 5
  for g, w in zip(got, streamed):
    assert sorted(g) == sorted(w)
    for name in w:
      np.testing.assert_array_equal(g[name], w[name], err_msg=name)
      assert g[name].dtype == w[name].dtype, name
  empty = packing.pack_in_memory([], 8, {"targets": tf.int32})
  assert empty.element_spec["targets"].shape == [8] and not list(empty)


def test_pack_dataset_streams_an_unlimited_dataset():
  ds = tf.data.Dataset.range(1, 6).map(lambda n: {"targets": tf.range(n) + 2})
  rows = list(dataset.pack_dataset(ds.repeat(), 8).take(10).as_numpy_iterator())
  assert len(rows) == 10
  for row in rows:
    seg, pos = row["targets_segmentation"], row["targets_position"]
    assert seg[0] == 1 and np.all(np.diff(seg[seg > 0]) >= 0)
    np.testing.assert_array_equal(row["targets"] == 0, seg == 0)
    starts = np.concatenate([[True], seg[1:] != seg[:-1]])
    assert np.all(pos[starts & (seg > 0)] == 0)


def test_trim_and_pad_and_ensure_eos():
  examples = [{"targets": np.arange(2, 2 + n, dtype=np.int32)} for n in (1, 5, 8)]
  ds = _dataset_of(examples, {"targets": tf.int32})
  padded = [r["targets"].tolist()
            for r in dataset.trim_and_pad_dataset(ds, 5).as_numpy_iterator()]
  assert padded == [[2, 0, 0, 0, 0], [2, 3, 4, 5, 6], [2, 3, 4, 5, 6]]
  with_eos = dataset.ensure_dataset_eos(dataset.trim_and_pad_dataset(ds, 5))
  assert [r["targets"].tolist() for r in with_eos.as_numpy_iterator()] == [
      [2, 0, 0, 0, 0], [2, 3, 4, 5, 1], [2, 3, 4, 5, 1]]
  # pack_or_pad(ensure_eos) puts EOS only where an example was cut.
  cut = dataset.pack_or_pad(ds, 5, pack=False, ensure_eos=True)
  assert [r["targets"].tolist() for r in cut.as_numpy_iterator()] == [
      [2, 0, 0, 0, 0], [2, 3, 4, 5, 6], [2, 3, 4, 5, 1]]


def test_pack_or_pad_bad_keys_and_lengths_name_the_feature():
  ds = _dataset_of([{"targets": np.ones([3], np.int32)}], {"targets": tf.int32})
  with pytest.raises(mtf.errors.MtfError, match="inputs"):
    dataset.pack_or_pad(ds, 4, feature_keys=["inputs"])
  with pytest.raises(mtf.errors.MtfError, match="targets"):
    dataset.pack_or_pad(ds, {"inputs": 4})


def test_encode_features_and_supervised_to_dict():
  pairs = tf.data.Dataset.from_tensor_slices((["ab", "é"], ["xyz", "q"]))
  as_dict = dataset.supervised_to_dict(pairs, text2self=False)
  encoded = list(dataset.encode_all_features(as_dict, BYTES).as_numpy_iterator())
  assert encoded[0]["inputs"].tolist() == BYTES.encode("ab") + [1]
  assert encoded[1]["targets"].tolist() == BYTES.encode("q") + [1]
  only_targets = dataset.supervised_to_dict(pairs, text2self=True)
  plain = list(dataset.encode_dataset(only_targets, BYTES).as_numpy_iterator())
  assert [sorted(x) for x in plain] == [["targets"], ["targets"]]
  assert plain[0]["targets"].tolist() == BYTES.encode("xyz")
  # A pair of vocabularies: the first encodes inputs, the second targets.
  pair = (vocabulary.ByteVocabulary(), _ShiftedBytes())
  both = next(dataset.encode_all_features(as_dict, pair).as_numpy_iterator())
  assert both["inputs"].tolist() == BYTES.encode("ab") + [1]
  assert both["targets"].tolist() == [i + 1 for i in BYTES.encode("xyz")] + [1]


class _ShiftedBytes(vocabulary.ByteVocabulary):

  def encode_tf(self, s):
    return super().encode_tf(s) + 1


def test_batch_dataset_repeats_and_drops_remainder():
  ds = tf.data.Dataset.range(5).map(lambda i: {"targets": tf.fill([3], i)})
  batches = list(dataset.batch_dataset(ds, 2).take(4).as_numpy_iterator())
  assert [b["targets"][:, 0].tolist() for b in batches] == [[0, 1], [2, 3], [4, 0],
                                                             [1, 2]]
  once = list(dataset.batch_dataset(ds, 2, repeat=False).as_numpy_iterator())
  assert len(once) == 2


def _write_lines(folder, name, lines):
  path = folder / name
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


def test_text_line_dataset_splits_are_disjoint_and_cover_every_line(tmp_path):
  lines = ["line number %d with ümlaut" % i for i in range(300)]
  _write_lines(tmp_path, "a.txt", lines[:150])
  _write_lines(tmp_path, "b.txt", lines[150:] + ["", "   "])
  glob = str(tmp_path / "*.txt")
  texts = {}
  for split in ("train", "validation"):
    ds = dataset.text_line_dataset(64, BYTES, split, glob=glob, pack=False,
                                   validation_fraction=0.2)
    rows = list(ds.as_numpy_iterator())
    assert all(r["targets"].shape == (64,) and 1 in r["targets"] for r in rows)
    texts[split] = [BYTES.decode(r["targets"]) for r in rows]
  assert set(texts["train"]).isdisjoint(texts["validation"])
  assert sorted(texts["train"] + texts["validation"]) == sorted(lines)
  assert 20 < len(texts["validation"]) < 100
  packed = dataset.text_line_dataset(128, BYTES, "train", glob=glob)
  row = next(packed.as_numpy_iterator())
  assert row["targets_segmentation"].max() >= 3


def test_text_corpus_dataset_cuts_files_into_sequences(tmp_path):
  text = "".join("sentence %d of the corpus. " % i for i in range(120))
  (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
  pieces = {}
  for split in ("train", "validation"):
    ds = dataset.text_corpus_dataset(32, BYTES, split,
                                     glob=str(tmp_path / "corpus.txt"),
                                     validation_fraction=0.1)
    rows = [r["targets"] for r in ds.as_numpy_iterator()]
    assert all(r.shape == (32,) and 1 in r for r in rows)
    pieces[split] = "".join(BYTES.decode(r) for r in rows)
  assert pieces["train"] + pieces["validation"] == text
  assert abs(len(pieces["validation"]) - 0.1 * len(text)) < 2


def test_missing_text_files_name_the_pattern(tmp_path):
  pattern = str(tmp_path / "nothing_here*.txt")
  for make in (lambda: dataset.make_text_line_dataset(pattern),
               lambda: dataset.text_line_dataset(16, BYTES, "train", glob=pattern),
               lambda: dataset.text_corpus_dataset(16, BYTES, "train", glob=pattern)):
    with pytest.raises(mtf.errors.MtfError, match="nothing_here"):
      make()


def test_unknown_split_is_refused(tmp_path):
  path = _write_lines(tmp_path, "x.txt", ["a"])
  with pytest.raises(mtf.errors.MtfError, match="dataset_split 'trian'"):
    dataset.text_line_dataset(16, BYTES, "trian", glob=str(path))


def test_dataset_functions_take_their_arguments_from_gin(tmp_path):
  path = _write_lines(tmp_path, "gin_lines.txt", ["first line", "second line"])
  gin.parse_config("h5_dataset_test/dataset.simple_text_line_dataset.glob = %r\n"
                   "h5_dataset_test/dataset.simple_text_line_dataset."
                   "shuffle_buffer_size = 0" % str(path))
  with gin.config_scope("h5_dataset_test"):
    ds = dataset.simple_text_line_dataset()
  assert [x["targets"] for x in ds.as_numpy_iterator()] == [b"first line",
                                                            b"second line"]


TINY_TFDS_LINES = {"train": ["tiny train line %d ü" % i for i in range(12)],
                   "validation": ["held-out line %d" % i for i in range(4)]}


def _tiny_tfds_builder_classes():
  """Two local TFDS builders, text and ids (defined once: TFDS registers names)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class H5TinyLines(tfds.core.GeneratorBasedBuilder):
    """Twelve train and four validation lines of text."""
    VERSION = tfds.core.Version("1.0.0")
    supervised_key = "text"

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self,
          features=tfds.features.FeaturesDict({
              "text": tfds.features.Text(),
              "ids": tfds.features.Sequence(tf.int64)}),
          supervised_keys=(self.supervised_key, self.supervised_key))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {split: self._generate_examples(split) for split in TINY_TFDS_LINES}

    def _generate_examples(self, split):
      for i, line in enumerate(TINY_TFDS_LINES[split]):
        yield i, {"text": line, "ids": [b + 3 for b in line.encode("utf-8")]}

  class H5TinyIds(H5TinyLines):
    """The same lines, already tokenized (byte ids)."""
    supervised_key = "ids"

  return H5TinyLines, H5TinyIds


@pytest.fixture(scope="module")
def tiny_tfds_dir(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  for builder_class in _tiny_tfds_builder_classes():
    builder_class(data_dir=data_dir).download_and_prepare(
        download_dir=data_dir + "/downloads")
  return data_dir


def test_untokenized_tfds_dataset_loads_local_data(tiny_tfds_dir):
  for split, tfds_split in (("train", "train"), ("eval", "validation")):
    ds = dataset.untokenized_tfds_dataset(
        dataset_name="h5_tiny_lines", text2self=True, tfds_data_dir=tiny_tfds_dir,
        dataset_split=split, sequence_length=32, vocabulary=BYTES, pack=False)
    rows = list(ds.as_numpy_iterator())
    assert all(r["targets"].shape == (32,) for r in rows)
    decoded = sorted(BYTES.decode(r["targets"]) for r in rows)
    assert decoded == sorted(line[:31] for line in TINY_TFDS_LINES[tfds_split])
  batched = dataset.untokenized_tfds_dataset(
      dataset_name="h5_tiny_lines", text2self=False, tfds_data_dir=tiny_tfds_dir,
      dataset_split="train", sequence_length={"inputs": 64, "targets": 64},
      vocabulary=BYTES, pack=True, batch_size=3)
  batch = next(batched.as_numpy_iterator())
  assert batch["inputs"].shape == (3, 64)
  np.testing.assert_array_equal(batch["inputs"], batch["targets"])
  assert batch["targets_segmentation"].max() >= 2


def test_pretokenized_tfds_dataset_appends_eos(tiny_tfds_dir):
  ds = dataset.pretokenized_tfds_dataset(
      dataset_name="h5_tiny_ids", text2self=True, tfds_data_dir=tiny_tfds_dir,
      dataset_split="validation", sequence_length=32, pack=False)
  rows = [r["targets"].tolist() for r in ds.as_numpy_iterator()]
  want = [BYTES.encode(line) + [1] for line in TINY_TFDS_LINES["validation"]]
  assert all(len(r) == 32 and r[r.index(1) + 1:] == [0] * (31 - r.index(1))
             for r in rows)
  assert sorted(r[:r.index(1) + 1] for r in rows) == sorted(want)
  with pytest.raises(mtf.errors.MtfError, match="h5_tiny_lines.*not pretokenized"):
    dataset.pretokenized_tfds_dataset(
        dataset_name="h5_tiny_lines", text2self=True, tfds_data_dir=tiny_tfds_dir,
        dataset_split="train", sequence_length=32)


def test_missing_tfds_data_names_dataset_and_directory(tmp_path):
  for name in ("lm1b", "h5_no_such_dataset"):
    with pytest.raises(mtf.errors.MtfError) as info:
      dataset.untokenized_tfds_dataset(
          dataset_name=name, text2self=True, tfds_data_dir=str(tmp_path),
          dataset_split="train", sequence_length=16, vocabulary=BYTES, pack=True)
    assert name in str(info.value) and str(tmp_path) in str(info.value)
  with pytest.raises(mtf.errors.MtfError, match="download_and_prepare"):
    dataset.pretokenized_tfds_dataset(
        dataset_name="lm1b", text2self=True, tfds_data_dir=str(tmp_path),
        dataset_split="train", sequence_length=16)
