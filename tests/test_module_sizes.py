"""Keeps modules small (the original's ops.py had 6,700 lines): prints sizes, fails past 800."""
import pathlib

LIMIT = 800
ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_library_modules_stay_small(capsys):
  sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(ROOT)))
                  for folder in ("mesh_tf", "models")
                  for p in (ROOT / folder).rglob("*.py")), reverse=True)
  with capsys.disabled():
    print("\nlargest modules:", ", ".join("%s (%d)" % (n, c) for c, n in sizes[:5]))
  too_big = [(n, c) for c, n in sizes if c > LIMIT]
  assert not too_big, "split these modules by responsibility: %s" % too_big


def test_the_heavy_files_scheduled_first_exist():
  """tests/conftest.py's HEAVY_FILES names real files (a renamed one would silently lose
  its early slot)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(__file__).resolve().parent.parent
  spec = importlib.util.spec_from_file_location("tests_root_conftest",
                                                root / "tests" / "conftest.py")
  conftest = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(conftest)
  missing = [p for p in conftest.HEAVY_FILES if not (root / p).is_file()]
  assert not missing, missing
  assert len(set(conftest.HEAVY_FILES)) == len(conftest.HEAVY_FILES)
