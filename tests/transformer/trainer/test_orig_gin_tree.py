"""Every gin file of the original's transformer/gin tree loads through the port's gin
path (gin_setup.parse_gin_file -> gin_compat), with every binding applied; the
original's defaults.gin + models/tiny.gin + layouts/2x2_dp_mp.gin build the model they
describe, with the same loss on one device and on their 2x4 mesh layout.

The tree is test data at ../shared/fixtures/orig_gin. Files that bind configurables
this port does not offer yet (layers being ported) or not as gin configurables (helpers
the TF 2 trainer does not consult) are listed in EXPECTED_SKIPPED_BINDINGS with the
names whose bindings are skipped; every other file must load with nothing skipped.
"""
import os
import pathlib
import re

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.trainer import gin_compat
from models.transformer.trainer import gin_setup
from models.transformer import transformer
from models.transformer.context import ModeKeys

_REPO = pathlib.Path(__file__).resolve().parents[3]
ORIG_GIN = pathlib.Path(os.environ.get("MESH_TF_SHARED", _REPO.parent / "shared")) / \
    "fixtures" / "orig_gin"

# file -> the not-yet-ported configurables whose bindings it may skip (remove an entry
# once those configurables exist: a listed file that skips nothing fails as stale).
EXPECTED_SKIPPED_BINDINGS = {}  # every binding of the original's gin tree applies


def _gin_files():
  return sorted(str(p.relative_to(ORIG_GIN)) for p in ORIG_GIN.rglob("*.gin"))


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


def test_the_whole_tree_is_here():
  assert len(_gin_files()) == 34, ORIG_GIN
  assert set(EXPECTED_SKIPPED_BINDINGS) <= set(_gin_files())


@pytest.mark.parametrize("name", _gin_files())
def test_original_gin_file_loads(name):
  path = ORIG_GIN / name
  skipped = gin_setup.parse_gin_file(str(path))
  allowed = EXPECTED_SKIPPED_BINDINGS.get(name, set())
  # Reasons read "configurable X is not offered: why" or "X has no parameter ...".
  skipped_names = {re.match(r"(?:configurable )?(\w+)", s.reason).group(1)
                   for s in skipped}
  assert skipped_names == allowed, (
      "%s skipped bindings of %s; expected only %s (update EXPECTED_SKIPPED_BINDINGS "
      "when a configurable gets ported)" % (name, sorted(skipped_names), sorted(allowed)))
  # Every binding the port kept is in the config, on a registered configurable.
  bindings = gin_compat.supported_bindings(path.read_text(), name)
  for binding in bindings:
    gin.query_parameter(binding)
  assert bindings or not skipped


def test_lm1b_binds_pack_dataset_and_the_tfds_vocabulary():
  gin_setup.parse_gin_file(str(ORIG_GIN / "problems" / "lm1b.gin"))
  assert gin.query_parameter("dataset.pack_dataset.use_custom_ops") is False
  macro = gin.query_parameter("vocabulary.get_tfds_vocabulary.dataset_name")
  assert str(macro) == "%dataset_name"
  assert gin.query_parameter("%dataset_name") == "lm1b/subwords32k"
  assert gin.query_parameter("pretokenized_tfds_dataset.text2self") is True


def _orig_config_loss(impl, prefix=None):
  """The Bitransformer the loaded gin config describes, its eval loss lowered on impl
  (weights restored from prefix when given)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  shape = [mtf.Dimension("batch", 4), mtf.Dimension("length", 8)]
  rng = np.random.RandomState(0)
  x, y = (rng.randint(2, 30, size=(4, 8)).astype(np.int32) for _ in range(2))
  inputs = mtf.import_tf_tensor(mesh, tf.constant(x), shape)
  targets = mtf.import_tf_tensor(mesh, tf.constant(y), shape)
  model = transformer.make_bitransformer(input_vocab_size=32, output_vocab_size=32)
  _, loss = model.call_simple(inputs, targets, True, mode=ModeKeys.EVAL,
                              variable_dtype=mtf.VariableDType(tf.float32))
  lowering = mtf.Lowering(graph, {mesh: impl})
  if prefix:
    mtf.restore_checkpoint(prefix, lowering)
  return graph, float(lowering.export_to_tf_tensor(loss))


def test_original_defaults_tiny_model_and_layout_drive_the_port(tmp_path):
  for name in ("defaults.gin", "models/tiny.gin", "layouts/2x2_dp_mp.gin"):
    gin_setup.parse_gin_file(str(ORIG_GIN / name))
  single = mtf.PlacementMeshImpl("", "", [""])
  graph, loss = _orig_config_loss(single)
  shapes = {v.name: v.outputs[0].shape.to_integer_list for v in graph.all_variables}
  # tiny.gin: 2 blocks, d_model 128, d_ff 512; defaults.gin: the layers of each block.
  assert shapes["encoder/block_001/layer_001/DenseReluDense/wi/kernel"] == [128, 512]
  assert "decoder/block_001/layer_001/EncDecAttention/q" in shapes
  assert not any("block_002" in name for name in shapes)
  mesh_shape = gin.query_parameter("utils.run.mesh_shape")
  layout = gin.query_parameter("utils.run.layout_rules")
  assert (mesh_shape, layout) == ("batch:2,model:4",
                                  "batch:batch,d_ff:model,heads:model,vocab:model")
  prefix = mtf.save_checkpoint(str(tmp_path / "model.ckpt"), single)
  impl = mtf.PlacementMeshImpl(mesh_shape, layout, ["/cpu:%d" % i for i in range(8)])
  _, mesh_loss = _orig_config_loss(impl, prefix)
  assert np.isfinite(loss) and mesh_loss == pytest.approx(loss, rel=1e-5)
