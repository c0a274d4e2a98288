"""tools/structure_report.py measures small fake package trees correctly."""
import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "tools", "structure_report.py")
_spec = importlib.util.spec_from_file_location("structure_report", _PATH)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def _tree(root, files):
  """Write {relative path: text} under root and return root as a string."""
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return str(root)


def test_lines_are_counted_per_package(tmp_path):
  lines = report.measure(_tree(tmp_path, {
      "mesh_tf/__init__.py": "import os\n\n\nX = 1\n",
      "mesh_tf/ops/a.py": "A = 1\n\nB = 2\nC = 3\n",
      "models/transformer/t.py": "T = 1\n",
      "models/transformer/trainer/r.py": "R = 1\nS = 2\n",
      "models/mlp/m.py": "\n\n",
      "other/ignored.py": "Z = 1\n"}))["lines"]
  assert lines == {"mesh_tf (top)": 2, "mesh_tf/ops": 3, "mesh_tf (total)": 5,
                   "models/transformer": 1, "models/transformer/trainer": 2,
                   "models/mlp": 0, "models (total)": 3}


def test_a_two_module_cycle_is_found_and_a_function_level_import_is_not(tmp_path):
  metrics = report.measure(_tree(tmp_path, {
      "mesh_tf/__init__.py": "",
      "mesh_tf/ops/__init__.py": "",
      "mesh_tf/ops/a.py": "from mesh_tf.ops import b\n",
      "mesh_tf/ops/b.py": "try:\n  from . import a\nexcept ImportError:\n  a = None\n",
      "models/c.py": "import models.d\nimport models.c\n",
      "models/d.py": "def f():\n  import models.c\n"}))
  assert metrics["import_cycles"] == [["mesh_tf.ops.a", "mesh_tf.ops.b"]]


def test_a_duplicated_block_is_one_region_per_file_and_a_trivial_block_is_none(tmp_path):
  block = "".join("value_%d = compute_something(%d)\n" % (i, i) for i in range(7))
  trivial = "x = [\n]\nif x:\n  pass\nelse:\n  pass\ny = (\n)\n"
  duplicates = report.measure(_tree(tmp_path, {
      "mesh_tf/one.py": "first = 1\n" + block.replace("(2)\n", "(2)\n  # a comment\n\n"),
      "models/two.py": "def g():\n\n" + "".join("  " + l for l in block.splitlines(True)),
      "mesh_tf/three.py": trivial,
      "models/four.py": trivial}))["duplicates"]
  assert duplicates["windows"] == 2
  assert duplicates["regions"] == 2
  assert duplicates["lines"] == 14
  assert duplicates["where"] == ["mesh_tf/one.py:2-10", "models/two.py:3-9"]


def test_reduction_tables_and_record_collective_calls_are_counted(tmp_path):
  metrics = report.measure(_tree(tmp_path, {"mesh_tf/r.py": (
      "TABLE = {'SUM': 1, 'MAX': 2}\n"
      "ONLY_SUM = {'SUM': 1}\n"
      "class Impl:\n"
      "  REDUCE = {'MIN': min, 'MAX': max, 'MEAN': None}\n"
      "  def record_collective(self, kind):\n"
      "    local = {'SUM': 0, 'MIN': 1}  # inside a function: not a table\n"
      "  def run(self):\n"
      "    self.record_collective('allreduce')\n"
      "    # record_collective( in a comment is no call\n"
      "    return record_collective('alltoall')\n")}))
  assert metrics["reduction_tables"] == ["mesh_tf/r.py:1", "mesh_tf/r.py:4"]
  assert metrics["record_collective_calls"] == 2


def test_the_table_shows_before_after_and_change(tmp_path):
  before = report.measure(_tree(tmp_path / "old", {"mesh_tf/a.py": "A = 1\nB = 2\n"}))
  after = report.measure(_tree(tmp_path / "new", {"mesh_tf/a.py": "A = 1\n"}))
  text = report.render(before, after, "old", "new")
  assert "| lines: mesh_tf (top) | 2 | 1 | -1 |" in text
  assert "| module-level import cycles | 0 | 0 | +0 |" in text
