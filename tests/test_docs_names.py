"""The code names and paths that docs/*.md put in backticks exist, so the guides stay true.

Each inline `code` span of a doc (fenced blocks are examples and are skipped; of a call,
`f(x, y)`, the name called) is read as:
- a path (has a "/" or a file extension): the file or folder exists in the repository
  (a bare file name: some file of that name; "<...>" placeholders: the folder before
  them; "../" paths, outside the repository, are skipped);
- a dotted name under `mtf.`, `mesh_tf.`, `models.`, `tf.`, `np.` or `gin.`: it imports
  and every attribute resolves;
- a name whose first part is a class defined in mesh_tf/ or models/: the class's
  attributes resolve (`MeshImpl.processor_groups`);
- any other name (`slicewise`, `x.shape`, `cached_memory`):
  each part appears as an identifier in the Python sources of mesh_tf/, models/ or
  tests/.
Spans with spaces or quotes (snippets, gin lines, commands) are not checked.
"""
import functools
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
SOURCE_DIRS = ("mesh_tf", "models", "tests")
ALIASES = {"mtf": "mesh_tf", "tf": "tensorflow", "np": "numpy"}
IMPORT_ROOTS = {"mesh_tf", "models", "tensorflow", "numpy", "gin"}
NAME = re.compile(r"^@?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\))?$")
CALL = re.compile(r"^@?([A-Za-z_][\w.]*)\(.*\)$")
FILE_SUFFIXES = (".py", ".md", ".gin", ".json", ".txt", ".ini", ".cfg")
# Spans a doc means as something else than a repository path or code name: {doc: spans}.
NOT_IN_REPO = {
    "multi_host.md": {"eval/eval_results-<step>.txt"},  # written under a run's model_dir
}


@functools.lru_cache(maxsize=None)
def _sources():
  return {p: p.read_text() for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")}


@functools.lru_cache(maxsize=None)
def _identifiers():
  words = set()
  for path, text in _sources().items():
    words.update(re.findall(r"[A-Za-z_]\w*", text))
    words.add(path.stem)
  return words


@functools.lru_cache(maxsize=None)
def _class_modules():
  """{class name: [dotted modules defining it]} over mesh_tf/ and models/."""
  found = {}
  for path, text in _sources().items():
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "tests":
      continue
    module = ".".join(rel.with_suffix("").parts)
    module = module[:-len(".__init__")] if module.endswith(".__init__") else module
    for name in re.findall(r"^class\s+(\w+)", text, flags=re.M):
      found.setdefault(name, []).append(module)
  return found


@functools.lru_cache(maxsize=None)
def _file_names():
  return {p.name for d in SOURCE_DIRS + ("docs", "gin_configs") for p in (ROOT / d).rglob("*")}


def _resolve(module_name, attrs):
  """Whether module_name (importable) has the attribute chain attrs; an attribute may
  be a submodule not imported yet."""
  obj = importlib.import_module(module_name)
  for a in attrs:
    if not hasattr(obj, a) and hasattr(obj, "__path__"):
      try:
        importlib.import_module(obj.__name__ + "." + a)
      except ImportError:
        return False
    if not hasattr(obj, a):
      return False
    obj = getattr(obj, a)
  return True


def _class_has(module_name, parts):
  """Whether class parts[0] of module_name has parts[1:] as attributes, or (one level)
  sets parts[1] on its instances (`self.<name> =` in the module)."""
  if _resolve(module_name, parts):
    return True
  base = ROOT.joinpath(*module_name.split("."))
  text = "".join(_sources().get(f, "") for f in (base.with_suffix(".py"),
                                                 base / "__init__.py"))
  return len(parts) == 2 and re.search(r"self\.%s\s*[:=]" % parts[1], text) is not None


def _path_problem(span):
  if span.startswith("../"):
    return None
  for mark in ("<", "*"):
    if mark in span:
      span = span[:span.index(mark)]
      span = span[:span.rindex("/") + 1] if "/" in span else ""
  if not span:
    return None
  if "/" not in span.rstrip("/"):
    ok = (ROOT / span).exists() or span in _file_names()
  else:
    ok = (ROOT / span).exists()
  return None if ok else "no file or folder %s" % span


def _name_problem(span):
  match = NAME.match(span)
  if not match:
    return None
  parts = match.group(1).split(".")
  parts[0] = ALIASES.get(parts[0], parts[0])
  if parts[0] in IMPORT_ROOTS:
    return None if _resolve(parts[0], parts[1:]) else "%s does not resolve" % span
  if len(parts) > 1 and parts[0] in _class_modules():
    if any(_class_has(m, parts) for m in _class_modules()[parts[0]]):
      return None
    return "%s: no such attribute of class %s" % (span, parts[0])
  missing = [p for p in parts if p not in _identifiers()]
  return "%s: %s in no source" % (span, ", ".join(missing)) if missing else None


def problems(text, skip=()):
  """What in text's backticked spans (but those in skip) names nothing in the
  repository."""
  text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
  found = []
  for span in re.findall(r"`([^`]+)`", text):  # a span may wrap onto the next line
    span = " ".join(span.split())
    call = CALL.match(span)
    if call:  # a call: check what is called
      span = call.group(1)
    if not span or span in skip or any(c in span for c in " \"'"):
      continue
    if "/" in span or span.endswith(FILE_SUFFIXES):
      problem = _path_problem(span)
    else:
      problem = _name_problem(span)
    if problem:
      found.append(problem)
  return found


def test_the_checker_finds_what_is_missing():
  unknown = "no_such_" + "name_anywhere"  # split: this file is a source it searches
  assert problems("`mesh_tf/backends/registry.py`, `mtf.make_mesh_impl`, `tf.distribute."
                  "Server`, `MeshImpl.slice_layout`, `Lowering.comm_records`, `slicewise(fn,"
                  " *inputs)`, `tests/ops/test_<f>.py`, `a snippet = 1`\n```\n`%s`\n```"
                  % unknown) == []
  assert problems("`mesh_tf/no_such_file.py` `mtf.no_such_fn` `MeshImpl.no_such_attr` "
                  "`%s` `skipped/file.py`" % unknown, skip={"skipped/file.py"}) == [
                      "no file or folder mesh_tf/no_such_file.py",
                      "mtf.no_such_fn does not resolve",
                      "MeshImpl.no_such_attr: no such attribute of class MeshImpl",
                      "%s: %s in no source" % (unknown, unknown)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_doc_names_exist(doc):
  assert problems(doc.read_text(), NOT_IN_REPO.get(doc.name, ())) == [], doc.name
