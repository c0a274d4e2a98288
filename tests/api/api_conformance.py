"""Compares the port's public API with the original's, name by name.

The reference is `../shared/api/original_api.json` (every public function, class and class
member of mesh-tensorflow 0.1.21, dumped with `inspect`). A name passes when the mapped
module offers it with the same kind and, for callables, the same parameter names, order,
kinds and defaults; the port may append parameters that have defaults. A class passes when
every member listed for it passes too.

Defaults compare by meaning: the dump holds `repr`s, so `<function assign_slice at 0x..>`
matches any function named `assign_slice`, class reprs match by class name, literals by
value. A parameter the original requires (no default, or gin.REQUIRED,
`<object object at 0x..>`) may have a default here: code written for the original always
passes it, so the default never changes what that code does. `required_with_default`
lists those parameters, so the departures stay visible.
"""
import ast
import importlib
import inspect
import json
import os
import pathlib
import re

import gin

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# `../shared` beside the repository; a checkout elsewhere names it in MESH_TF_SHARED.
SHARED = pathlib.Path(os.environ.get("MESH_TF_SHARED", REPO_ROOT.parent / "shared"))
REFERENCE = SHARED / "api" / "original_api.json"

# The dump cut long reprs at this many characters; such a default compares as a prefix.
_REPR_CUT = 60
_GIN_REQUIRED_REPR = "<object object>"
_EMPTY = inspect.Parameter.empty


def load_reference(path=REFERENCE):
  """The original's API: {module: {name: entry}}."""
  with open(path) as f:
    return json.load(f)


def port_module_name(original_module):
  """`mesh_tensorflow[.X]` -> `mesh_tf[.X]`; `mesh_tensorflow.transformer.X` ->
  `models.transformer.X`."""
  if original_module == "mesh_tensorflow.transformer" or original_module.startswith(
      "mesh_tensorflow.transformer."):
    return "models" + original_module[len("mesh_tensorflow"):]
  return "mesh_tf" + original_module[len("mesh_tensorflow"):]


def _normalize_repr(text):
  """Strips addresses and module paths from a repr so the two sides compare."""
  text = re.sub(r"<class '(?:[\w]+\.)*(\w*)'?>?", r"<class \1>", text)
  text = re.sub(r"<function (?:[\w<>]+\.)*(\w+) at 0x[0-9a-f]*>?", r"<function \1>", text)
  text = re.sub(r"<(?:[\w]+\.)*(\w+) object at 0x[0-9a-f]*>?", r"<\1 object>", text)
  text = re.sub(r"<dtype: '(\w+)'>", r"tf.\1", text)
  return text


def _port_default_repr(value):
  if value is gin.REQUIRED:
    return _GIN_REQUIRED_REPR
  if inspect.isclass(value):
    return "<class %s>" % value.__name__
  if callable(value) and hasattr(value, "__name__") and not isinstance(value, type):
    return "<function %s>" % value.__name__
  return _normalize_repr(repr(value))


def _is_required(original_default):
  """Whether the original's parameter has no default or defaults to gin.REQUIRED."""
  return original_default is None or bool(
      re.fullmatch(r"<object object at 0x[0-9a-f]+>", original_default))


def default_matches(original, port_value):
  """Whether the port's default means what the original's repr says."""
  if _is_required(original):
    # The original's callers always pass it; any port default (or none) is compatible.
    return True
  if port_value is _EMPTY:
    return False
  try:
    literal = ast.literal_eval(original)
  except (ValueError, SyntaxError):
    literal = _EMPTY
  if literal is not _EMPTY:
    numbers = (int, float)
    if (isinstance(literal, numbers) and isinstance(port_value, numbers) and
        not isinstance(literal, bool) and not isinstance(port_value, bool)):
      return literal == port_value  # 0 and 0.0 mean the same default
    try:
      return type(literal) is type(port_value) and bool(literal == port_value)
    except (TypeError, ValueError):  # e.g. an array default
      return False
  want = _normalize_repr(original)
  instance_of = re.fullmatch(r"<(\w+) object>", want)
  if instance_of and instance_of.group(1) != "object":
    return type(port_value).__name__ == instance_of.group(1)
  got = _port_default_repr(port_value)
  if len(original) >= _REPR_CUT:
    return got.startswith(want.rstrip(">"))
  return got == want


def _describe(params):
  return "(%s)" % ", ".join(
      p[0] if p[2] is None else "%s=%s" % (p[0], p[2]) for p in params)


def compare_params(original_params, signature):
  """Problems with the port's signature against the original's parameter list."""
  port = list(signature.parameters.values())
  orig = [tuple(p) for p in original_params]
  problems = []
  orig_var_kw = orig and orig[-1][1] == "VAR_KEYWORD"
  port_var_kw = port and port[-1].kind == inspect.Parameter.VAR_KEYWORD
  if orig_var_kw:
    if not port_var_kw:
      problems.append("lacks **%s" % orig[-1][0])
    orig = orig[:-1]
  if port_var_kw:
    port = port[:-1]  # a **kwargs the original lacks only widens what calls accept
  for i, (name, kind, default) in enumerate(orig):
    if i >= len(port):
      problems.append("lacks parameter %r" % name)
      continue
    p = port[i]
    if p.name != name:
      problems.append("parameter %d is %r, the original's %r" % (i, p.name, name))
      continue
    if p.kind.name != kind:
      problems.append("parameter %r is %s, the original's %s" % (name, p.kind.name, kind))
    if kind not in ("VAR_POSITIONAL", "VAR_KEYWORD") and not default_matches(
        default, p.default):
      problems.append("parameter %r defaults to %s, the original's to %s" % (
          name, "nothing" if p.default is _EMPTY else _port_default_repr(p.default),
          default or "nothing"))
  orig_has_var_pos = any(k == "VAR_POSITIONAL" for _, k, _ in orig)
  for p in port[len(orig):]:
    if p.kind == inspect.Parameter.VAR_POSITIONAL:
      continue
    if p.default is _EMPTY:
      problems.append("appends %r without a default" % p.name)
    elif orig_has_var_pos and p.kind != inspect.Parameter.KEYWORD_ONLY:
      problems.append("appends %r after *args" % p.name)
  return problems


def _signature(obj):
  try:
    return inspect.signature(obj)
  except (TypeError, ValueError):
    return None


def check_callable(obj, entry):
  """Problems of one function or method against its reference entry."""
  if not callable(obj):
    return ["is not callable"]
  sig = _signature(obj)
  if sig is None:
    return ["has no inspectable signature"]
  problems = compare_params(entry.get("params") or [], sig)
  if problems:
    problems.append("port %s, original %s" % (sig, _describe(entry.get("params") or [])))
  return problems


def check_member(cls, member, entry):
  """Problems of one class member (a method or a property)."""
  if not hasattr(cls, member):
    return ["lacks member %s" % member]
  if entry["kind"] == "property":
    static = inspect.getattr_static(cls, member)
    if not (hasattr(static, "__get__") and not inspect.isfunction(static) and
            not isinstance(static, (staticmethod, classmethod))):
      return ["%s is not a property" % member]
    return []
  static = inspect.getattr_static(cls, member)
  if isinstance(static, classmethod):  # the reference lists a classmethod's `cls`
    problems = check_callable(static.__func__, entry)
  else:
    problems = check_callable(getattr(cls, member), entry)
  return ["%s: %s" % (member, p) for p in problems]


def check_name(original_module, name, entry):
  """Problems of one public name of the original (empty when it conforms)."""
  module_name = port_module_name(original_module)
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    return ["module %s does not import: %s" % (module_name, e)]
  if not hasattr(module, name):
    return ["%s lacks %s" % (module_name, name)]
  obj = getattr(module, name)
  if entry["kind"] == "class":
    if not inspect.isclass(obj):
      return ["%s.%s is not a class" % (module_name, name)]
    problems = []
    for member, member_entry in sorted(entry.get("members", {}).items()):
      problems.extend(check_member(obj, member, member_entry))
    return problems
  if inspect.isclass(obj):
    return ["%s.%s is a class, the original's a function" % (module_name, name)]
  return check_callable(obj, entry)


def all_names(reference=None):
  """Every (module, name, entry) of the reference, sorted."""
  reference = reference or load_reference()
  return [(m, n, e) for m in sorted(reference) for n, e in sorted(reference[m].items())]


def failures(reference=None):
  """{"module.name": [problems]} for each name that does not conform."""
  out = {}
  for module, name, entry in all_names(reference):
    problems = check_name(module, name, entry)
    if problems:
      out["%s.%s" % (module, name)] = problems
  return out


def _callables(module, name, entry):
  """(label, port callable, reference entry) of a name and its methods, where present."""
  try:
    obj = getattr(importlib.import_module(port_module_name(module)), name)
  except (ImportError, AttributeError):
    return []
  if entry["kind"] != "class":
    return [("%s.%s" % (module, name), obj, entry)]
  out = []
  for member, member_entry in entry.get("members", {}).items():
    if member_entry["kind"] != "property" and hasattr(obj, member):
      static = inspect.getattr_static(obj, member)
      fn = static.__func__ if isinstance(static, classmethod) else getattr(obj, member)
      out.append(("%s.%s.%s" % (module, name, member), fn, member_entry))
  return out


def required_with_default(reference=None):
  """["module.name(.member): param", ...] where the original requires a parameter
  that the port gives a default (gin.REQUIRED counts as requiring it)."""
  out = []
  for module, name, entry in all_names(reference):
    for label, fn, fn_entry in _callables(module, name, entry):
      sig = _signature(fn)
      if sig is None:
        continue
      port = {p.name: p for p in sig.parameters.values()}
      for param, kind, default in fn_entry.get("params") or []:
        p = port.get(param)
        if (p is not None and kind not in ("VAR_POSITIONAL", "VAR_KEYWORD") and
            _is_required(default) and p.default is not _EMPTY and
            p.default is not gin.REQUIRED):
          out.append("%s: %s" % (label, param))
  return out
