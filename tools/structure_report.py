"""Measure the code structure of mesh_tf/ and models/ before and after a change (issue 33).

For each of two revisions it counts non-blank lines per package, module-level import
cycles, record_collective call sites, reduction tables (module- or class-level dict
literals keyed by at least two of "SUM", "MAX", "MIN") and blocks of six or more lines
that appear in two places, then prints a markdown table of before, after and change.

  python tools/structure_report.py [--before REV] [--after REV] [--json]

A revision is read with `git archive`; without --after the working tree is measured.
The script only reports: its exit status is always 0.
"""
import argparse
import ast
import collections
import json
import os
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("mesh_tf", "models")
WINDOW = 6
REDUCTION_KEYS = {"SUM", "MAX", "MIN"}


def python_files(root):
  """Sorted '/'-separated paths, relative to root, of the .py files of PACKAGES."""
  found = []
  for package in PACKAGES:
    for folder, dirs, files in os.walk(os.path.join(root, package)):
      dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
      rel = os.path.relpath(folder, root).replace(os.sep, "/")
      found += [rel + "/" + name for name in files if name.endswith(".py")]
  return sorted(found)


def package_of(rel):
  """The row a file's lines count under: 'mesh_tf/ops', 'mesh_tf (top)', ..."""
  parts = rel.split("/")
  if len(parts) == 2:
    return parts[0] + " (top)"
  if parts[:3] == ["models", "transformer", "trainer"] and len(parts) > 3:
    return "models/transformer/trainer"
  return parts[0] + "/" + parts[1]


def lines_per_package(sources):
  """{package row: non-blank lines}, with a '<package> (total)' row per package."""
  counts = collections.Counter()
  for rel, text in sources.items():
    n = sum(1 for line in text.splitlines() if line.strip())
    counts[package_of(rel)] += n
    counts[rel.split("/")[0] + " (total)"] += n
  return dict(counts)


def module_name(rel):
  """The dotted module name of a file: 'a/b/__init__.py' -> 'a.b'."""
  dotted = rel[:-len(".py")].replace("/", ".")
  return dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted


def module_level_imports(tree):
  """The import statements run at import time: top level and inside top-level if/try."""
  pending, found = list(tree.body), []
  while pending:
    node = pending.pop()
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      found.append(node)
    elif isinstance(node, ast.If):
      pending += node.body + node.orelse
    elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
      pending += node.body + node.orelse + node.finalbody
      pending += [stmt for handler in node.handlers for stmt in handler.body]
  return found


def imported_modules(module, is_package, tree, modules):
  """The modules of `modules` that `module` imports at module level."""
  targets = set()
  for node in module_level_imports(tree):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    else:
      base = node.module or ""
      if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:max(0, len(package) - node.level + 1)]
        base = ".".join(package + [base] if base else package)
      # `from X import Y` imports the module X.Y when there is one, else a name of X.
      names = [base + "." + alias.name if base + "." + alias.name in modules else base
               for alias in node.names]
    for name in names:
      while name not in modules and "." in name:  # a name inside module `name`
        name = name.rsplit(".", 1)[0]
      if name in modules and name != module:
        targets.add(name)
  return targets


def import_graph(trees):
  """{module: set of modules it imports at module level} for parsed files {rel: tree}."""
  modules = {module_name(rel): rel for rel in trees}
  return {m: imported_modules(m, rel.endswith("/__init__.py"), trees[rel], modules)
          for m, rel in modules.items()}


def _reachable(graph, start):
  seen, stack = set(), [start]
  while stack:
    fresh = set(graph.get(stack.pop(), ())) - seen
    seen |= fresh
    stack += fresh
  return seen


def import_cycles(graph):
  """Strongly connected components of more than one module, each a sorted list."""
  reach = {m: _reachable(graph, m) for m in graph}
  components = {frozenset({m} | {n for n in reach[m] if m in reach[n]}) for m in graph}
  return sorted(sorted(c) for c in components if len(c) > 1)


def _outside_functions(node):
  """node and its descendants, without entering function or lambda bodies."""
  yield node
  for child in ast.iter_child_nodes(node):
    if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      yield from _outside_functions(child)


def reduction_tables(rel, tree):
  """'file:line' of each module- or class-level dict literal keyed by 2+ reductions."""
  found = []
  for node in _outside_functions(tree):
    if isinstance(node, ast.Dict):
      keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
      if len(keys & REDUCTION_KEYS) >= 2:
        found.append("%s:%d" % (rel, node.lineno))
  return found


def record_collective_calls(tree):
  """The number of calls (not definitions) of record_collective in tree."""
  return sum(1 for node in ast.walk(tree) if isinstance(node, ast.Call) and
             getattr(node.func, "attr", getattr(node.func, "id", None)) ==
             "record_collective")


def _normalized(text):
  """(line number, stripped line) of the lines that are neither blank nor comments."""
  stripped = ((i, line.strip()) for i, line in enumerate(text.splitlines(), 1))
  return [(i, s) for i, s in stripped if s and not s.startswith("#")]


def duplicated_blocks(sources):
  """Distinct 6-line windows found in 2+ places, and the regions they merge into."""
  places, normalized = collections.defaultdict(list), {}
  for rel in sorted(sources):
    lines = normalized[rel] = _normalized(sources[rel])
    for start in range(len(lines) - WINDOW + 1):
      window = tuple(s for _, s in lines[start:start + WINDOW])
      # Runs of brackets, `else:` and quotes repeat everywhere and mean nothing.
      if sum(len(s) > 10 for s in window) >= 4:
        places[window].append((rel, start))
  duplicated = [where for where in places.values() if len(where) > 1]
  regions = []
  for rel, start in sorted(p for where in duplicated for p in where):
    if regions and regions[-1][0] == rel and start <= regions[-1][2]:
      regions[-1][2] = max(regions[-1][2], start + WINDOW)
    else:
      regions.append([rel, start, start + WINDOW])
  return {"windows": len(duplicated), "regions": len(regions),
          "lines": sum(end - start for _, start, end in regions),
          "where": ["%s:%d-%d" % (rel, normalized[rel][start][0], normalized[rel][end - 1][0])
                    for rel, start, end in regions]}


def read_sources(root):
  """{relative path: text} of the .py files of PACKAGES under root."""
  sources = {}
  for rel in python_files(root):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
      sources[rel] = f.read()
  return sources


def parse_sources(sources):
  """{relative path: ast tree} of sources (a file that does not parse is skipped)."""
  trees = {}
  for rel, text in sources.items():
    try:
      trees[rel] = ast.parse(text, rel)
    except SyntaxError:
      print("structure_report: cannot parse %s; skipped" % rel, file=sys.stderr)
  return trees


def measure(root):
  """Every metric of the mesh_tf/ and models/ trees under root, as a dict."""
  sources = read_sources(root)
  trees = parse_sources(sources)
  return {"lines": lines_per_package(sources),
          "import_cycles": import_cycles(import_graph(trees)),
          "record_collective_calls": sum(map(record_collective_calls, trees.values())),
          "reduction_tables": [t for rel in sorted(trees)
                               for t in reduction_tables(rel, trees[rel])],
          "duplicates": duplicated_blocks(sources)}


def measure_revision(rev):
  """measure() of a git revision read with `git archive`, or of the working tree."""
  if rev is None:
    return measure(REPO_ROOT)
  with tempfile.TemporaryDirectory() as tmp:
    archive = subprocess.run(["git", "-C", REPO_ROOT, "archive", rev, "--"] +
                             list(PACKAGES), check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    return measure(tmp)


def summary(metrics):
  """The numbers of the report's table, in row order: {metric: number}."""
  rows = {"lines: " + p: n for p, n in sorted(metrics["lines"].items()) if "(total)" not in p}
  for package in PACKAGES:
    rows["total lines: " + package] = metrics["lines"].get(package + " (total)", 0)
  rows["module-level import cycles"] = len(metrics["import_cycles"])
  rows["record_collective call sites"] = metrics["record_collective_calls"]
  rows["reduction tables"] = len(metrics["reduction_tables"])
  rows["distinct duplicated 6-line windows"] = metrics["duplicates"]["windows"]
  rows["duplicated regions (6+ lines)"] = metrics["duplicates"]["regions"]
  rows["code lines in duplicated regions"] = metrics["duplicates"]["lines"]
  return rows


def render(before, after, before_name, after_name):
  """The markdown report: the before/after table, then the after cycles and tables."""
  old, new = summary(before), summary(after)
  packages = sorted(n for n in set(old) | set(new) if n.startswith("lines: "))
  lines = ["| metric | before (%s) | after (%s) | change |" % (before_name, after_name),
           "|---|---:|---:|---:|"]
  for name in packages + [n for n in new if not n.startswith("lines: ")]:
    a, b = old.get(name, 0), new.get(name, 0)
    lines.append("| %s | %d | %d | %+d |" % (name, a, b, b - a))
  lines += ["", "Import cycles (after): %d" % len(after["import_cycles"])]
  lines += ["- " + ", ".join(cycle) for cycle in after["import_cycles"]]
  lines += ["", "Reduction tables (after): %d" % len(after["reduction_tables"])]
  lines += ["- " + where for where in after["reduction_tables"]]
  return "\n".join(lines)


def main(argv=None):
  """Parse arguments, measure both revisions and print the report; returns 0."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--before", default="d729bd8^", help="git revision (default d729bd8^)")
  parser.add_argument("--after", default=None, help="git revision (default: working tree)")
  parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
  args = parser.parse_args(argv)
  after_name = args.after or "working tree"
  try:
    before, after = measure_revision(args.before), measure_revision(args.after)
  except subprocess.CalledProcessError as e:
    print("structure_report: %s: %s" % (e.cmd, (e.stderr or b"").decode().strip()),
          file=sys.stderr)
    return 0
  if args.json:
    print(json.dumps({"before": dict(revision=args.before, numbers=summary(before), **before),
                      "after": dict(revision=after_name, numbers=summary(after), **after)},
                     indent=1))
  else:
    print(render(before, after, args.before, after_name))
  return 0


if __name__ == "__main__":
  sys.exit(main())
