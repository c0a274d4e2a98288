"""The import structure the README promises: no module-level import cycle in mesh_tf/ or
models/, and each mesh_tf folder of the README's architecture table imports only the
folders listed above it.

Imports are read from the source (module-level statements only; an import inside a
function runs later and cannot make an import-time cycle), so a new cycle or a new
upward import fails here before it fails at import time.
"""
import os
import re

from test_structure_report import report  # tools/structure_report.py, loaded by path

REPO_ROOT = report.REPO_ROOT


def import_graph():
  """{module: set of modules it imports at module level} over mesh_tf/ and models/
  (tools/structure_report.py: top-level statements and those inside top-level if/try)."""
  return report.import_graph(report.parse_sources(report.read_sources(REPO_ROOT)))


cycles = report.import_cycles


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
