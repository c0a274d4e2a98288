"""Synthetic encoder-decoder tasks: correct targets, determinism, bad arguments."""
import numpy as np
import pytest

import mesh_tf as mtf
from models.transformer import synthetic_tasks
from models.transformer import vocabulary

BYTES = vocabulary.ByteVocabulary()


def _unpad(ids):
  ids = ids.tolist()
  assert 1 in ids
  end = ids.index(1)
  assert all(i == 0 for i in ids[end + 1:])
  return ids[:end]


@pytest.mark.parametrize("task,transform", [
    (synthetic_tasks.synthetic_reverse_dataset, lambda x: x[::-1]),
    (synthetic_tasks.synthetic_sort_dataset, sorted)])
def test_targets_are_the_transformed_inputs(task, transform):
  ds = task({"inputs": 12, "targets": 12}, BYTES, "train", num_tokens=7, seed=3)
  rows = list(ds.take(50).as_numpy_iterator())
  lengths = set()
  for row in rows:
    assert row["inputs"].shape == (12,) and row["targets"].dtype == np.int32
    inputs, targets = _unpad(row["inputs"]), _unpad(row["targets"])
    assert targets == list(transform(inputs))
    assert all(100 <= i < 107 for i in inputs)  # 'a'..'g' in ByteVocabulary
    lengths.add(len(inputs))
  assert min(lengths) >= 1 and max(lengths) <= 11 and len(lengths) > 3


def test_splits_are_deterministic_and_different():
  def draw(split, seed=0):
    ds = synthetic_tasks.synthetic_reverse_dataset(10, BYTES, split, seed=seed)
    return np.stack([r["inputs"] for r in ds.take(30).as_numpy_iterator()])
  np.testing.assert_array_equal(draw("train"), draw("train"))
  assert not np.array_equal(draw("train"), draw("validation"))
  assert not np.array_equal(draw("train"), draw("train", seed=1))
  np.testing.assert_array_equal(draw("validation"), draw("eval"))
  validation = synthetic_tasks.synthetic_sort_dataset(10, BYTES, "validation",
                                                      num_validation_examples=17)
  assert len(list(validation.as_numpy_iterator())) == 17


def test_fixed_length_packed_and_generic_vocabulary():
  big = vocabulary.ByteVocabulary(extra_ids=0)
  ds = synthetic_tasks.synthetic_sort_dataset(16, big, "train", length=3,
                                              num_tokens=40, pack=True)
  row = next(ds.as_numpy_iterator())
  assert row["inputs_segmentation"].max() == 4  # four 3+EOS examples per row
  np.testing.assert_array_equal(row["inputs_segmentation"], row["targets_segmentation"])
  assert np.all(row["inputs"][row["inputs"] > 1] >= 3)  # more than 26 tokens: from 3


def test_bad_arguments_are_named():
  with pytest.raises(mtf.errors.MtfError, match="length"):
    synthetic_tasks.synthetic_reverse_dataset(8, BYTES, "train", length=8)
  with pytest.raises(mtf.errors.MtfError, match="vocabulary"):
    synthetic_tasks.synthetic_reverse_dataset(8, BYTES, "train", num_tokens=300)
  with pytest.raises(mtf.errors.MtfError, match="inputs"):
    synthetic_tasks.synthetic_reverse_dataset({"targets": 8}, BYTES, "train")
