"""The library half of the original API, name by name, against shared/api/original_api.json.

Every public function and class of the original's core modules (mesh_tensorflow, .ops,
.layers, .optimize, .placement_mesh_impl, .simd_mesh_impl, .utils, .beam_search,
.test_utils, .tpu_variables, .ops_with_redefined_builtins) must exist in the mapped
mesh_tf module, and every class member listed there (methods with their parameters,
properties as properties). Parameters are compatible when every call the original
accepts binds the same way here: the original's parameters come first, in order, with
the same names, kinds and defaults; the port may append parameters that have defaults,
and may give a default to a parameter the original required (ADDED_DEFAULTS lists each
such name with the reason, so the set cannot grow unnoticed). LEDGER lists names that
truly cannot match, with the reason; an entry of either that matches again fails as
stale.

Run as a script (`python tests/api/test_core_api_surface.py`) to print the gaps.
"""
import importlib
import inspect
import json
import os
import pathlib
import re

import tensorflow as tf

API_JSON = pathlib.Path(os.environ.get(  # the same override as api_conformance.py's
    "MESH_TF_SHARED",
    pathlib.Path(__file__).resolve().parents[2].parent / "shared")) / "api" / \
    "original_api.json"

CORE_MODULES = [
    "mesh_tensorflow", "mesh_tensorflow.ops", "mesh_tensorflow.layers",
    "mesh_tensorflow.optimize", "mesh_tensorflow.placement_mesh_impl",
    "mesh_tensorflow.simd_mesh_impl", "mesh_tensorflow.utils",
    "mesh_tensorflow.beam_search", "mesh_tensorflow.test_utils",
    "mesh_tensorflow.tpu_variables", "mesh_tensorflow.ops_with_redefined_builtins",
]

# "module.name" -> why it cannot match. None today.
LEDGER = {}

_IS_TRAINING = ("is_training defaults to True: the port's own layers and models call it "
                "without the argument")
# "module.name" -> why the port gives a default to a parameter the original required.
ADDED_DEFAULTS = {
    "mesh_tf.Shape": "Shape() is the empty shape",
    "mesh_tf.ops.Shape": "Shape() is the empty shape",
    "mesh_tf.LayoutRules": "LayoutRules() are the empty rules",
    "mesh_tf.ops.LayoutRules": "LayoutRules() are the empty rules",
    "mesh_tf.SlicewiseOperation": "splittable_dims=None means every dim is splittable",
    "mesh_tf.ops.SlicewiseOperation": "splittable_dims=None means every dim is splittable",
    "mesh_tf.dropout": _IS_TRAINING,
    "mesh_tf.ops.dropout": _IS_TRAINING,
    "mesh_tf.log_variable_sizes": "var_list and tag may be omitted (nothing is logged)",
    "mesh_tf.ops.log_variable_sizes": "var_list and tag may be omitted (nothing is logged)",
    "mesh_tf.layers.dot_product_attention": _IS_TRAINING,
    "mesh_tf.layers.masked_local_attention_1d": _IS_TRAINING,
    "mesh_tf.layers.multihead_attention": _IS_TRAINING,
    "mesh_tf.layers.multihead_self_attention_memory_compressed": _IS_TRAINING,
    "mesh_tf.layers.multihead_self_attention_incremental":
        "master_dtype and slice_dtype default to float32",
    "mesh_tf.placement_mesh_impl.PlacementMeshImpl":
        "devices=None puts every processor on the default device (README, Backends)",
}

_EMPTY = inspect.Parameter.empty


def port_module_name(original_module):
  """mesh_tensorflow[.X] -> mesh_tf[.X]."""
  return "mesh_tf" + original_module[len("mesh_tensorflow"):]


def _normalized_default(text):
  """The JSON's default text without object addresses, comparable with _port_default."""
  if text is None:
    return None
  text = re.sub(r" at 0x[0-9a-f]+", "", text)
  text = re.sub(r"^<function (\w+)>?.*", r"fn:\1", text)
  text = re.sub(r"^<mesh_tensorflow\.ops\.VariableDType.*", "VariableDType", text)
  return text[:50]


def _port_default(param):
  value = param.default
  if value is _EMPTY:
    return None
  if inspect.isfunction(value):
    return "fn:" + value.__name__
  if type(value).__name__ == "VariableDType":
    return "VariableDType"
  if isinstance(value, tf.DType):
    return "tf." + value.name
  return _normalized_default(repr(value))


def parameter_problems(original_params, fn, added_defaults=None):
  """Why fn's signature does not take every call of the original's; '' if it does.

  Parameters the original required and the port gives a default are appended to the
  list added_defaults, if given.
  """
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError) as e:
    return "no signature (%s)" % e
  problems = []
  for i, (name, kind, default) in enumerate(original_params):
    if i >= len(params):
      problems.append("missing parameter %s" % name)
      continue
    p, want = params[i], _normalized_default(default)
    got = _port_default(p)
    if p.name != name or p.kind.name != kind or (want != got and want is not None):
      problems.append("parameter %d is %s %s=%s, the original's %s %s=%s" % (
          i, p.name, p.kind.name, got, name, kind, want))
    elif want is None and got is not None and added_defaults is not None:
      added_defaults.append(name)
  for p in params[len(original_params):]:
    if p.default is _EMPTY and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
      problems.append("extra required parameter %s" % p.name)
  return "; ".join(problems)


def member_problems(cls, members, added_defaults=None):
  """Problems of the class's members against the original's."""
  problems = []
  for name, spec in sorted(members.items()):
    static = inspect.getattr_static(cls, name, None)
    if static is None:
      problems.append("no member %s" % name)
      continue
    if spec["kind"] == "property":
      if inspect.isfunction(static) or isinstance(static, (classmethod, staticmethod)):
        problems.append("%s is a method, the original's a property" % name)
      elif not hasattr(static, "__get__"):
        problems.append("%s is a plain class attribute, not a property" % name)
      continue
    if isinstance(static, property):
      problems.append("%s is a property, the original's a method" % name)
      continue
    params = spec["params"]
    if isinstance(static, classmethod):
      params = params[1:]
    why = parameter_problems(params, getattr(cls, name), added_defaults)
    if why:
      problems.append("%s(%s)" % (name, why))
  return problems


def entry_problems(module, name, entry, added_defaults=None):
  """Why `module.name` does not match the original's entry; '' when it does."""
  obj = getattr(module, name, None)
  if obj is None:
    return "missing"
  if entry["kind"] == "function":
    return parameter_problems(entry["params"], obj, added_defaults)
  if not inspect.isclass(obj):
    return "not a class"
  return " | ".join(member_problems(obj, entry["members"], added_defaults))


def core_api_gaps():
  """({"mesh_tf.module.name": problem}, number of names checked, {"mesh_tf.module.name":
  parameters given a default the original did not have})."""
  spec = json.loads(API_JSON.read_text())
  gaps, total, defaulted = {}, 0, {}
  for original in CORE_MODULES:
    port_name = port_module_name(original)
    module = importlib.import_module(port_name)
    for name, entry in sorted(spec[original].items()):
      total += 1
      added = []
      why = entry_problems(module, name, entry, added)
      key = "%s.%s" % (port_name, name)
      if why:
        gaps[key] = why
      if added:
        defaulted[key] = added
  return gaps, total, defaulted


def test_every_core_name_matches_the_original():
  gaps, total, _ = core_api_gaps()
  unexplained = {k: v for k, v in gaps.items() if k not in LEDGER}
  assert not unexplained, "%d of %d names differ from the original:\n%s" % (
      len(unexplained), total, "\n".join("%s: %s" % kv for kv in sorted(unexplained.items())))
  assert total >= 500  # the JSON's core modules hold 513 names


def test_ledger_has_no_stale_entries():
  gaps, _, _ = core_api_gaps()
  stale = [k for k in LEDGER if k not in gaps]
  assert not stale, "ledger names that now match the original: %s" % stale


def test_parameters_given_defaults_are_the_listed_ones():
  _, _, defaulted = core_api_gaps()
  unlisted = {k: v for k, v in defaulted.items() if k not in ADDED_DEFAULTS}
  assert not unlisted, "parameters the original required now have defaults: %s" % unlisted
  stale = [k for k in ADDED_DEFAULTS if k not in defaulted]
  assert not stale, "ADDED_DEFAULTS entries that now match the original: %s" % stale


def test_the_checker_catches_renamed_reordered_and_new_required_parameters():
  original = [["x", "POSITIONAL_OR_KEYWORD", None], ["name", "POSITIONAL_OR_KEYWORD", "None"]]

  def renamed(t, name=None):
    return t, name

  def reordered(name=None, x=None):
    return x, name

  def new_required(x, name=None, extra=None, *, must):
    return x, name, extra, must

  def other_default(x, name="relu"):
    return x, name

  def compatible(x=1, name=None, extra=3, **kwargs):
    return x, name, extra, kwargs
  for fn in (renamed, reordered, new_required, other_default):
    assert parameter_problems(original, fn), fn.__name__
  added = []
  assert parameter_problems(original, compatible, added) == ""
  assert added == ["x"]


if __name__ == "__main__":
  found, checked, with_defaults = core_api_gaps()
  for key, problem in sorted(found.items()):
    print("%s: %s" % (key, problem))
  for key, params in sorted(with_defaults.items()):
    print("%s: defaults added to %s" % (key, params))
  print("%d of %d names match" % (checked - len(found), checked))
