"""Gin for the trainer: import every configurable, find and parse gin files, and turn
gin's errors into MtfErrors naming the binding and the file."""
import contextlib
import importlib
import logging
import os

import gin

from mesh_tf.errors import MtfError
from models.transformer.trainer import gin_compat

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
DEFAULT_GIN_LOCATION = os.path.join(REPO_ROOT, "gin_configs")

# Modules whose gin configurables a config may name.
CONFIGURABLE_MODULES = (
    "mesh_tf", "mesh_tf.learning_rate_schedules", "mesh_tf.optimize",
    "models.transformer.utils", "models.transformer.transformer",
    "models.transformer.layer_stack", "models.transformer.vocab_embeddings",
    "models.transformer.transformer_layers", "models.transformer.attention",
    "models.transformer.moe", "models.transformer.vocabulary",
    "models.transformer.t2t_vocabulary", "models.transformer.learning_rate_schedules",
    "models.transformer.dataset", "models.transformer.default_corpus",
    "models.transformer.synthetic_tasks", "models.transformer.decoding",
    "models.transformer.trainer.decode_io", "models.transformer.adaptive_softmax",
    "models.transformer.funnel_transformer", "models.transformer.universal_transformer",
    "models.transformer.evolved_transformer", "models.transformer.heterogeneous_moe",
    "models.transformer.memory_layers", "models.transformer.fixup_layers",
    "models.transformer.trainer.step_metrics")


def import_configurables():
  """Imports CONFIGURABLE_MODULES; returns the names of those not present."""
  absent = []
  for name in CONFIGURABLE_MODULES:
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name != name:
        raise
      absent.append(name)
  return absent


def find_gin_file(path, prefixes):
  """path as given if it exists, else under the first prefix that has it."""
  candidates = [path] + [os.path.join(p, path) for p in prefixes]
  if not path.endswith(".gin"):
    candidates += [c + ".gin" for c in candidates]
  for candidate in candidates:
    if os.path.isfile(candidate):
      return candidate
  raise MtfError("gin file %s not found (looked in: %s)"
                 % (path, ", ".join([os.getcwd()] + list(prefixes))), file=path)


@contextlib.contextmanager
def _quiet_include_probes():
  """Drops gin's "Path not found" errors: an `include` first probes the path as given,
  which fails for names that the search path then finds."""
  def keep(record):
    return record.module != "resource_reader"
  logging.getLogger().addFilter(keep)
  try:
    yield
  finally:
    logging.getLogger().removeFilter(keep)


def parse_gin(gin_files=(), gin_params=(), prefixes=None, with_defaults=True,
              skip_unknown=False):
  """Parses defaults.gin (if the first prefix has one), gin_files and gin_params.

  Raises MtfError naming the file (or binding) and gin's complaint, e.g. an unknown
  configurable (unless gin's skip_unknown, True or a list of names, skips it)."""
  import_configurables()
  prefixes = list(prefixes or [DEFAULT_GIN_LOCATION])
  for prefix in prefixes:
    gin.add_config_file_search_path(prefix)
  files = [find_gin_file(f, prefixes) for f in gin_files]
  defaults = os.path.join(prefixes[0], "defaults.gin")
  if with_defaults and os.path.isfile(defaults):
    files = [defaults] + [f for f in files if os.path.abspath(f) != defaults]
  for path in files:
    skipped = _parse_file(path, skip_unknown)
    if skipped:
      print(gin_compat.format_skipped(path, skipped), flush=True)
  for binding in gin_params:
    try:
      gin.parse_config(binding, skip_unknown=skip_unknown)
    except (ValueError, KeyError, TypeError, SyntaxError) as e:
      raise MtfError("gin binding %r: %s" % (binding, e)) from e
  return files


def _parse_file(path, skip_unknown=False):
  """Parses one gin file (an original Mesh-TensorFlow config through gin_compat);
  returns the gin_compat.SkippedBinding list of what it left out."""
  with open(path) as f:
    text = f.read()
  if gin_compat.is_original_config(text):
    return gin_compat.parse_original_config(text, path, skip_unknown=skip_unknown)
  try:
    with _quiet_include_probes():
      gin.parse_config_file(path, skip_unknown=skip_unknown)
  except (ValueError, KeyError, TypeError, SyntaxError, IOError) as e:
    raise MtfError("gin file %s: %s" % (path, e), file=path) from e
  return []


def parse_gin_file(path):
  """Parses one gin file as parse_gin does; returns the gin_compat.SkippedBinding list
  of what it left out."""
  import_configurables()
  return _parse_file(path)
