"""The import structure the README promises: no module-level import cycle in mesh_tf/ or
models/, and each mesh_tf folder of the README's architecture table imports only the
folders listed above it.

Imports are read from the source (module-level statements only; an import inside a
function runs later and cannot make an import-time cycle), so a new cycle or a new
upward import fails here before it fails at import time.
"""
import ast
import os
import re

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("mesh_tf", "models")


def _modules():
  """{dotted module name: file path} of every module of PACKAGES."""
  found = {}
  for package in PACKAGES:
    for folder, _, files in os.walk(os.path.join(REPO_ROOT, package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(folder, name)
          dotted = os.path.relpath(path, REPO_ROOT)[:-3].replace(os.sep, ".")
          found[dotted[:-len(".__init__")] if dotted.endswith(".__init__")
                else dotted] = path
  return found


def _imported(module, path, modules):
  """The modules of `modules` that module imports at module level."""
  targets = set()
  for node in ast.parse(open(path).read(), path).body:
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = module.split(".")
        if not path.endswith("__init__.py"):
          parts = parts[:-1]
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      names = [base + "." + a.name if base + "." + a.name in modules else base
               for a in node.names]
    else:
      continue
    for name in names:
      while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
      if name in modules and name != module:
        targets.add(name)
  return targets


def import_graph():
  """{module: set of modules it imports at module level} over PACKAGES."""
  modules = _modules()
  return {m: _imported(m, path, modules) for m, path in modules.items()}


def cycles(graph):
  """The strongly connected components of more than one module (each sorted)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_the_cycle_finder_finds_a_cycle():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_cycle():
  found = cycles(import_graph())
  assert not found, "module-level import cycles: %s" % found


def _readme_folder_order():
  """The mesh_tf/ folders of README.md's architecture table, top to bottom."""
  text = open(os.path.join(REPO_ROOT, "README.md")).read()
  table = text[text.index("## Architecture"):]
  table = table[:table.index("\n## ", 1)]
  assert "Each layer depends only on those above it" in table
  return re.findall(r"^\| `mesh_tf/(\w+)/` \|", table, flags=re.M)


def test_each_mesh_tf_folder_imports_only_folders_above_it_in_the_readme():
  order = _readme_folder_order()
  assert {"shapes", "graph", "ops", "lowering", "backends", "layers"} <= set(order), order
  rank = {folder: i for i, folder in enumerate(order)}
  upward = []
  for module, targets in import_graph().items():
    parts = module.split(".")
    if parts[0] != "mesh_tf" or len(parts) < 3 or parts[1] not in rank:
      continue
    for target in targets:
      tparts = target.split(".")
      if (tparts[0] == "mesh_tf" and len(tparts) > 1 and tparts[1] in rank and
          rank[tparts[1]] > rank[parts[1]]):
        upward.append("%s imports %s" % (module, target))
  assert not upward, "imports of folders listed below the importer: %s" % upward
