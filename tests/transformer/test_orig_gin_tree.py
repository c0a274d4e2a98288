"""Every gin file of the original's transformer/gin tree loads through the port's gin
path (gin_setup.parse_gin_file -> gin_compat), with every binding applied.

The tree is test data at ../shared/fixtures/orig_gin. Files that bind configurables
this port does not offer yet are listed in EXPECTED_SKIPPED_BINDINGS with the names
whose bindings are skipped; every other file must load with nothing skipped.
"""
import os
import pathlib

import gin
import pytest

from models.transformer import gin_compat
from models.transformer import gin_setup

_REPO = pathlib.Path(__file__).resolve().parents[2]
ORIG_GIN = pathlib.Path(os.environ.get("MESH_TF_SHARED", _REPO.parent / "shared")) / \
    "fixtures" / "orig_gin"

# file -> the not-yet-ported configurables whose bindings it may skip (remove an entry
# once those configurables exist: a listed file that skips nothing fails as stale).
EXPECTED_SKIPPED_BINDINGS = {
    "defaults.gin": {"TalkingHeadsSelfAttention", "GeneralBilinearSelfAttention"},
    "transparent_attention.gin": {"TransparentEncDecAttention"},
}


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
  not_ported = {s.reason.split(" is not ported yet")[0] for s in skipped}
  assert all(s.reason.endswith(" is not ported yet") for s in skipped), skipped
  assert not_ported == allowed, (
      "%s skipped bindings of %s; expected only %s (update EXPECTED_SKIPPED_BINDINGS "
      "when a configurable gets ported)" % (name, sorted(not_ported), sorted(allowed)))
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
