"""The original's private helpers of transformer/utils.py that its tests call:
_dynamic_text2self (text2text features -> one delimited_lm sequence) and
_maybe_add_pretokenized_features (decoded copies of inputs/targets)."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import utils


def _lowered(features, length):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  shape = mtf.Shape([mtf.Dimension("batch", len(features["inputs"])),
                     mtf.Dimension("length", length)])
  mtf_features = {k: mtf.import_tf_tensor(mesh, tf.constant(v, tf.int32), shape)
                  for k, v in features.items()}
  out = utils._dynamic_text2self(mtf_features)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(shape=[], layout={}, devices=[""])
  lowering = mtf.Lowering(graph, {mesh: impl})
  return {k: np.array(lowering.export_to_tf_tensor(v)).tolist() for k, v in out.items()}, out


def test_packed_segments_interleave_inputs_then_targets_per_segment():
  got, out = _lowered({
      # example 0: two segments, inputs [5 6 | 7], targets [8 | 9 4]
      "inputs": [[5, 6, 7, 0]],
      "inputs_segmentation": [[1, 1, 2, 0]],
      "inputs_position": [[0, 1, 0, 0]],
      "targets": [[8, 9, 4, 0]],
      "targets_segmentation": [[1, 2, 2, 0]],
      "targets_position": [[0, 0, 1, 0]],
  }, length=4)
  assert sorted(got) == ["targets", "targets_position", "targets_segmentation"]
  assert out["targets"].shape.dimension_names == ["batch", "length"]
  assert out["targets"].shape.dims[-1].size == 8
  assert got["targets"] == [[5, 6, 8, 7, 9, 4, 0, 0]]
  assert got["targets_segmentation"] == [[1, 1, 1, 2, 2, 2, 0, 0]]
  assert got["targets_position"] == [[0, 1, 2, 0, 1, 2, 0, 0]]


def test_unpacked_examples_concatenate_non_padding_inputs_and_targets():
  got, _ = _lowered({
      "inputs": [[2, 3, 0], [4, 4, 4]],
      "targets": [[7, 0, 0], [1, 2, 0]],
  }, length=3)
  assert list(got) == ["targets"]
  assert got["targets"] == [[2, 3, 7, 0, 0, 0], [4, 4, 4, 1, 2, 0]]


class _Vocab(object):

  def __init__(self, letters):
    self.letters = letters
    self.calls = []

  def decode(self, ids):
    self.calls.append(ids)
    return "".join(self.letters[i] for i in ids)


def test_pretokenized_features_are_decoded_only_where_missing():
  inputs_vocab, targets_vocab = _Vocab("abcdef"), _Vocab("UVWXYZ")
  examples = [
      {"inputs": np.array([1, 2]), "targets": np.array([3, 0])},
      {"targets": np.array([5]), "targets_pretokenized": "given"},
      {"other": np.array([1])},
  ]
  result = utils._maybe_add_pretokenized_features(examples,
                                                  (inputs_vocab, targets_vocab))
  assert result is examples
  assert examples[0]["inputs_pretokenized"] == "bc"
  assert examples[0]["targets_pretokenized"] == "XU"
  assert examples[1] == {"targets": examples[1]["targets"],
                         "targets_pretokenized": "given"}
  assert examples[2] == {"other": examples[2]["other"]}
  # The vocabulary sees python lists of ints, one call per missing feature.
  assert inputs_vocab.calls == [[1, 2]] and targets_vocab.calls == [[3, 0]]
  assert all(type(i) is int for i in targets_vocab.calls[0])


def test_one_vocabulary_serves_both_features():
  vocab = _Vocab("abcdef")
  (example,) = utils._maybe_add_pretokenized_features(
      [{"inputs": [0, 1], "targets": [2]}], vocab)
  assert example["inputs_pretokenized"] == "ab" and example["targets_pretokenized"] == "c"
