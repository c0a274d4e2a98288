"""Reads gin files written for (or by) the original Mesh-TensorFlow trainer, which name
configurables by module path (`@mesh_tensorflow.transformer.transformer_layers.X`),
import (and alias) `mesh_tensorflow` modules and bind parameters this port lacks.

`translate_text` rewrites the paths to this port's gin modules and drops the imports;
`parse_original_config` binds what this port supports and returns every binding it
skipped with the reason. A configurable unknown to both this port and
OMITTED_CONFIGURABLES is an error.
"""
import collections
import inspect
import re

import gin
from gin import config_parser

from mesh_tf.errors import MtfError

# Configurables of the original that this port deliberately does not offer.
OMITTED_CONFIGURABLES = {
    "rewrite_stack_variables": "autostacking: this port keeps variables unstacked",
    "tpu_estimator_model_fn": "TPUEstimator-only; the TF 2 trainer has its own loop",
    "get_checkpoint_iterator": "the trainer picks checkpoints itself",
    "separate_vocabularies": "utils.run takes one vocabulary (utils.separate_vocabularies "
                             "is offered as a function)",
    "variable_filter_max_size": "utils.run trains every variable (utils."
                                "variable_filter_max_size is offered as a function)",
}

# Selectors the original's own gin files use that name a configurable by another module
# than the one registering it (e.g. problems/lm1b.gin binds
# `dataset.get_tfds_vocabulary`, which lives in the vocabulary module).
SELECTOR_ALIASES = {
    "dataset.get_tfds_vocabulary": "vocabulary.get_tfds_vocabulary",
}

# `mesh_tensorflow.<module>.` -> the gin module prefix used here ("" = bare name).
TOP_LEVEL_MODULES = {
    "optimize": "mesh_tf.optimize.",
    "beam_search": "beam_search.",
    "layers": "",
    "ops": "",
    "ops_with_redefined_builtins": "",
    "simd_mesh_impl": "",
    "placement_mesh_impl": "",
    "utils": "",
}

SkippedBinding = collections.namedtuple("SkippedBinding", ["binding", "line", "reason"])


def _import_aliases(text):
  """{alias: module} for every `import mesh_tensorflow... as alias` line."""
  return {m.group(2): m.group(1) for m in re.finditer(
      r"^\s*import\s+(mesh_tensorflow[\w.]*)\s+as\s+(\w+)\s*$", text, re.MULTILINE)}


def _port_prefix(path):
  """This port's gin prefix for an original module path like
  "mesh_tensorflow.transformer.transformer_layers" (without trailing dot)."""
  parts = path.split(".")[1:]
  if parts[:1] == ["transformer"] and len(parts) >= 2:
    return parts[1] + "."
  return TOP_LEVEL_MODULES.get(parts[0], "") if parts else ""


def translate_text(text):
  """The text with `import mesh_tensorflow...` lines dropped and every reference to an
  original module (or an import alias of one) rewritten to this port's gin names."""
  aliases = _import_aliases(text)
  text = re.sub(r"^\s*(from\s+mesh_tensorflow\S*\s+)?import\s+mesh_tensorflow\b.*$", "",
                text, flags=re.MULTILINE)
  text = re.sub(r"^\s*from\s+mesh_tensorflow\S*\s+import\s+.*$", "", text,
                flags=re.MULTILINE)
  for alias in sorted(aliases, key=len, reverse=True):
    text = re.sub(r"(?<![\w.])%s\." % re.escape(alias), aliases[alias] + ".", text)
  # The longest known module path first: "mesh_tensorflow.transformer.<module>." is a
  # module, "mesh_tensorflow.<module>." a top-level one.
  def replace(match):
    return _port_prefix(match.group(0)[:-1])
  text = re.sub(r"(?<![\w.])mesh_tensorflow\.transformer\.\w+\.", replace, text)
  text = re.sub(r"(?<![\w.])mesh_tensorflow\.\w+\.", replace, text)
  for selector, port_selector in SELECTOR_ALIASES.items():
    text = re.sub(r"(?<![\w.])%s\b" % re.escape(selector), port_selector, text)
  return text


class _RecordingDelegate(config_parser.ParserDelegate):
  """Parses references and macros to plain tuples (nothing is looked up)."""

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return ("@", scoped_configurable_name, evaluate)

  def macro(self, macro_name):
    return ("%", macro_name)


def _configurable(selector):
  """The registered configurable for selector, or None."""
  try:
    return gin.get_configurable(selector)
  except (KeyError, ValueError):
    return None


def _accepts(fn_or_cls, arg_name):
  """Whether fn_or_cls takes a parameter arg_name (or **kwargs)."""
  try:
    params = inspect.signature(fn_or_cls).parameters
  except (TypeError, ValueError):
    return True
  return arg_name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def _references(value):
  """The configurable names referenced (`@name`) anywhere in a parsed binding value."""
  if isinstance(value, tuple) and len(value) == 3 and value[0] == "@":
    return [value[1]]
  if isinstance(value, dict):
    value = list(value.keys()) + list(value.values())
  if isinstance(value, (list, tuple)):
    return [name for v in value for name in _references(v)]
  return []


def _skip_reason(statement):
  """Why a binding statement is skipped here, or None to keep it."""
  bound = [statement.selector] if statement.arg_name else []  # none for a macro
  for selector in _references(statement.value) + bound:
    name = selector.split(".")[-1]
    if name in OMITTED_CONFIGURABLES and _configurable(selector) is None:
      return "configurable %s is not offered: %s" % (name, OMITTED_CONFIGURABLES[name])
  configurable = _configurable(statement.selector) if bound else None
  # None (an unknown configurable) is kept: gin reports it when the text is parsed
  if configurable is not None and not _accepts(configurable, statement.arg_name):
    return "%s has no parameter %r in this port" % (statement.selector.split(".")[-1],
                                                    statement.arg_name)
  return None


def _binding_text(statement):
  scope = statement.scope + "/" if statement.scope else ""
  return "%s%s.%s" % (scope, statement.selector, statement.arg_name)


def filter_supported(text, filename=None):
  """(text without the unsupported bindings, [SkippedBinding]) for translated text."""
  try:
    statements = list(config_parser.ConfigParser(text, _RecordingDelegate()))
  except SyntaxError as e:
    raise MtfError("gin file %s: %s" % (filename or "<string>", e), file=filename) from e
  lines = text.split("\n")
  starts = [s.location.line_num - 1 for s in statements] + [len(lines)]
  skipped, drop = [], set()
  for i, statement in enumerate(statements):
    if not isinstance(statement, config_parser.BindingStatement):
      continue
    reason = _skip_reason(statement)
    if reason is None:
      continue
    skipped.append(SkippedBinding(_binding_text(statement), statement.location.line_num,
                                  reason))
    drop.update(range(starts[i], starts[i + 1]))
  kept = [line for n, line in enumerate(lines) if n not in drop]
  return "\n".join(kept), skipped


def parse_original_config(text, filename=None, skip_unknown=False):
  """Translates an original gin config, binds what this port supports and returns the
  list of SkippedBinding (binding, line, reason) left out. Raises MtfError naming the
  file and gin's complaint (e.g. an unknown configurable, unless skip_unknown)."""
  translated, skipped = filter_supported(translate_text(text), filename)
  try:
    gin.parse_config(translated, skip_unknown=skip_unknown)
  except (ValueError, KeyError, TypeError, SyntaxError, ImportError) as e:
    raise MtfError("gin file %s (original Mesh-TensorFlow config): %s"
                   % (filename or "<string>", e), file=filename) from e
  return skipped


def is_original_config(text):
  """Whether a gin file's text names the original library's modules."""
  return re.search(r"(?<![\w.])mesh_tensorflow\w*\b", text) is not None


def format_skipped(filename, skipped):
  """A readable report of the skipped bindings of one file."""
  head = "gin file %s: skipped %d binding(s) this port does not support:" % (
      filename, len(skipped))
  return "\n".join([head] + ["  line %d: %s (%s)" % (s.line, s.binding, s.reason)
                             for s in skipped])


def supported_bindings(text, filename=None):
  """The "scope/selector.param" of every binding of an original config that this port
  binds (translated, unsupported ones left out)."""
  kept, _ = filter_supported(translate_text(text), filename)
  statements = config_parser.ConfigParser(kept, _RecordingDelegate())
  return [_binding_text(s) for s in statements
          if isinstance(s, config_parser.BindingStatement) and s.arg_name]
