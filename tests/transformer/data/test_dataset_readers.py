"""The original's file readers (parallel TSV, pretokenized TFRecord, T2T files) on files
the tests write, and the original's padding/packing behaviours that the eval loop and
gin files rely on (batched trim_and_pad, pass-through features, use_custom_ops)."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import dataset
from models.transformer import vocabulary

BYTES = vocabulary.ByteVocabulary()


def _unpack(rows, key):
  """The examples packed into rows, in order, from the segmentation feature."""
  out = []
  for row in rows:
    seg = row[key + "_segmentation"]
    for s in range(1, seg.max() + 1):
      ids = row[key][seg == s]
      np.testing.assert_array_equal(row[key + "_position"][seg == s],
                                    np.arange(len(ids)))
      out.append(ids.tolist())
  return out


def _write_tfrecord(path, examples):
  with tf.io.TFRecordWriter(str(path)) as writer:
    for ex in examples:
      feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
                 for k, v in ex.items()}
      writer.write(tf.train.Example(
          features=tf.train.Features(feature=feature)).SerializeToString())


PAIRS = [("hello", "bonjour"), ("a", "b"), ("cat\twith tab", "chat"),
         ("longer input line", "x")]


def test_packed_parallel_tsv_dataset_encodes_and_packs_pairs(tmp_path):
  path = tmp_path / "pairs.tsv"
  path.write_text("".join("%s\t%s\n" % p for p in PAIRS))
  lines = tf.data.TextLineDataset(str(path))
  ds = dataset.packed_parallel_tsv_dataset(
      dataset=lines, dataset_split="train", sequence_length=24, vocabulary=BYTES)
  rows = list(ds.as_numpy_iterator())
  assert all(r["inputs"].shape == (24,) for r in rows)
  # The first tab splits: the rest of the line (tabs included) is the targets.
  want_inputs = [BYTES.encode(i) + [1] for i in ["hello", "a", "cat", "longer input line"]]
  want_targets = [BYTES.encode(t) + [1] for t in ["bonjour", "b", "with tab\tchat", "x"]]
  assert _unpack(rows, "inputs") == want_inputs
  assert _unpack(rows, "targets") == want_targets
  assert len(rows) < len(PAIRS)  # several pairs share a row

  short = dataset.packed_parallel_tsv_dataset(
      dataset=lines, dataset_split="train", sequence_length=24,
      vocabulary=(BYTES, vocabulary.ByteVocabulary(extra_ids=5)), append_eos=False,
      max_encoded_len=5, batch_size=1)
  batch = next(short.as_numpy_iterator())
  assert batch["inputs"].shape == (1, 24)
  # Only ("a", "b") has both sides within 5 ids; no EOS appended.
  assert _unpack([{k: v[0] for k, v in batch.items()}], "targets") == [BYTES.encode("b")]


def test_packed_parallel_tsv_dataset_refuses_a_line_without_tab(tmp_path):
  lines = tf.data.Dataset.from_tensor_slices(["no tab here"])
  ds = dataset.packed_parallel_tsv_dataset(
      dataset=lines, dataset_split="train", sequence_length=16, vocabulary=BYTES)
  with pytest.raises(tf.errors.InvalidArgumentError, match="no tab: .*no tab here"):
    list(ds)
  with pytest.raises(mtf.errors.MtfError, match="tf.data.Dataset"):
    dataset.packed_parallel_tsv_dataset(dataset=["a\tb"], dataset_split="train",
                                        sequence_length=16, vocabulary=BYTES)


EXAMPLES = [{"inputs": [5, 6, 7], "targets": [8, 9]},
            {"inputs": [10], "targets": [11, 12, 13]},
            {"inputs": [14, 15], "targets": [16]}]


def test_pretokenized_tfrecord_dataset_reads_packs_and_shifts(tmp_path):
  path = tmp_path / "data.tfrecord"
  _write_tfrecord(path, EXAMPLES)
  ds = dataset.pretokenized_tfrecord_dataset(
      filenames=[str(path)], text2self=False, eos_included=False, repeat=False,
      batch_size=None, sequence_length={"inputs": 8, "targets": 8}, vocab_shift=100)
  rows = list(ds.as_numpy_iterator())
  assert rows[0]["inputs"].dtype == np.int32
  for key in ("inputs", "targets"):
    assert _unpack(rows, key) == [[i + 100 for i in ex[key]] + [1] for ex in EXAMPLES]

  lm = dataset.pretokenized_tfrecord_dataset(
      filenames=str(path), text2self=True, eos_included=True, repeat=True,
      batch_size=2, sequence_length=4)
  batches = list(lm.take(3).as_numpy_iterator())
  assert set(batches[0]) == {"targets", "targets_segmentation", "targets_position"}
  assert all(b["targets"].shape == (2, 4) for b in batches)  # repeat: never runs out
  with pytest.raises(mtf.errors.MtfError, match="missing.tfrecord"):
    dataset.pretokenized_tfrecord_dataset([str(tmp_path / "missing.tfrecord")], True,
                                          True, False, None, 4)


def test_pretokenized_t2t_dataset_finds_the_split_files(tmp_path):
  _write_tfrecord(tmp_path / "my_problem-dev-00000-of-00001", EXAMPLES)
  _write_tfrecord(tmp_path / "my_problem-train-00000-of-00001", EXAMPLES[:1])
  ds = dataset.pretokenized_t2t_dataset(
      dataset_name="my_problem", data_dir=str(tmp_path), dataset_split="dev",
      sequence_length=8)
  rows = list(ds.as_numpy_iterator())
  assert _unpack(rows, "inputs") == [ex["inputs"] for ex in EXAMPLES]  # EOS included
  train = dataset.pretokenized_t2t_dataset(
      dataset_name="my_problem", text2self=True, data_dir=str(tmp_path),
      sequence_length=8)
  rows = list(train.take(3).as_numpy_iterator())  # the train split repeats
  assert [_unpack([r], "targets") for r in rows] == [[[8, 9]] * 4] * 3
  with pytest.raises(mtf.errors.MtfError, match="my_problem-validation-"):
    dataset.pretokenized_t2t_dataset(dataset_name="my_problem", data_dir=str(tmp_path),
                                     dataset_split="validation", sequence_length=8)


def test_trim_and_pad_dataset_pads_a_short_batch():
  rows = tf.data.Dataset.from_tensor_slices(
      {"targets": np.arange(15, dtype=np.int32).reshape([5, 3]),
       "ids": np.arange(5, dtype=np.int64)}).batch(4)
  padded = list(dataset.trim_and_pad_dataset(rows, 4).as_numpy_iterator())
  assert [b["targets"].shape for b in padded] == [(4, 3), (4, 3)]
  np.testing.assert_array_equal(padded[1]["targets"], [[12, 13, 14]] + [[0, 0, 0]] * 3)
  np.testing.assert_array_equal(padded[1]["ids"], [4, 0, 0, 0])
  only_targets = dataset.trim_and_pad_dataset(rows, 2, feature_keys=["targets"])
  first = next(only_targets.as_numpy_iterator())
  assert first["targets"].shape == (2, 3) and first["ids"].shape == (4,)


def test_pack_or_pad_without_packing_passes_other_features_through():
  ds = tf.data.Dataset.from_tensors(
      {"targets": tf.constant([5, 6, 7]), "targets_pretokenized": tf.constant("abc")})
  out = next(dataset.pack_or_pad(ds, 5, pack=False, feature_keys=["targets"])
             .as_numpy_iterator())
  assert out["targets_pretokenized"] == b"abc"
  np.testing.assert_array_equal(out["targets"], [5, 6, 7, 0, 0])
  packed = next(dataset.pack_or_pad(ds, 5, pack=True, feature_keys=["targets"])
                .as_numpy_iterator())
  assert "targets_pretokenized" not in packed  # packing keeps only the packed keys


def test_pack_dataset_is_gin_configurable_with_use_custom_ops():
  examples = tf.data.Dataset.from_tensor_slices(
      tf.ragged.constant([[3, 4], [5], [6, 7, 8]])).map(lambda x: {"targets": x})
  plain = list(dataset.pack_dataset(examples, 4).as_numpy_iterator())
  with gin.unlock_config():
    gin.parse_config("dataset.pack_dataset.use_custom_ops = True")
  try:
    configured = list(dataset.pack_dataset(examples, 4).as_numpy_iterator())
    assert gin.query_parameter("dataset.pack_dataset.use_custom_ops") is True
  finally:
    gin.clear_config()
  assert len(plain) == len(configured) == 2
  for a, b in zip(plain, configured):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  np.testing.assert_array_equal(plain[0]["targets"], [3, 4, 5, 0])
  with pytest.raises(mtf.errors.MtfError, match="use_custom_ops"):
    dataset.pack_dataset(examples, 4, use_custom_ops="yes")
