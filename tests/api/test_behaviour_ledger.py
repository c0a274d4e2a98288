"""behaviour_ledger.py is well-formed: every entry has an area, a known kind and a
reason; a named original test looks like "<file>_test.py[::Class.method]"; each entry
that says it differs deliberately quotes a phrase that README.md's "What differs from
the original" section contains; the port's own tests an entry points to exist; and the
measured pass counts are consistent."""
import os
import re

import pytest

import behaviour_ledger as ledger

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY_IDS = ["%s|%s" % (e.get("area"), e.get("test")) for e in ledger.LEDGER]
TEST_NAME = re.compile(r"^mesh_tensorflow/[\w/]+_test\.py(::\w+\.\w+)?$")


def _readme_differences():
  text = open(os.path.join(REPO_ROOT, "README.md")).read()
  start = text.index("## What differs from the original")
  end = text.index("\n## ", start + 1)
  return " ".join(text[start:end].split())  # phrases may wrap across lines


@pytest.mark.parametrize("entry", ledger.LEDGER, ids=ENTRY_IDS)
def test_entry_is_well_formed(entry):
  assert set(entry) <= {"area", "test", "cases", "kind", "reason", "readme", "ours"}
  assert ("cases" in entry) == (entry["test"] is not None), entry
  assert isinstance(entry["area"], str) and entry["area"].strip()
  assert entry["kind"] in ledger.KINDS, entry["kind"]
  assert isinstance(entry["reason"], str) and len(entry["reason"].split()) >= 8
  if entry["test"] is not None:
    assert TEST_NAME.match(entry["test"]), entry["test"]
    assert isinstance(entry["cases"], int) and entry["cases"] >= 1
  if entry.get("ours"):
    assert os.path.exists(os.path.join(REPO_ROOT, entry["ours"])), entry["ours"]


@pytest.mark.parametrize(
    "entry", [e for e in ledger.LEDGER if e["kind"] == ledger.DELIBERATE],
    ids=lambda e: "%s|%s" % (e["area"], e["test"]))
def test_deliberate_difference_is_explained_in_readme(entry):
  phrase = entry.get("readme")
  assert phrase, "a deliberate difference needs the README phrase that explains it"
  assert " ".join(phrase.split()) in _readme_differences(), phrase


def test_only_deliberate_entries_cite_the_readme():
  for entry in ledger.LEDGER:
    if entry["kind"] != ledger.DELIBERATE:
      assert "readme" not in entry, entry


def test_original_tests_are_ledgered_once():
  named = [e["test"] for e in ledger.LEDGER if e["test"]]
  assert len(named) == len(set(named)), named


def test_measured_counts_are_consistent():
  m = ledger.MEASURED
  assert 0 <= m["passed"] <= m["total"]
  assert 0 <= m["distinct_passed"] <= m["distinct_total"] <= m["total"]
  # Every failing test case of the measurement is accounted for by one entry.
  assert sum(e["cases"] for e in ledger.LEDGER if e["test"]) == m["total"] - m["passed"]
