"""Plans (mesh_tf/plans) from shapes alone: the cases of plan_cases.py, run here and in
an interpreter where TensorFlow cannot be imported."""
import pytest

import plan_cases
from tf_free import run_without_tensorflow


@pytest.mark.parametrize("case", plan_cases.CASES)
def test_plan(case):
  getattr(plan_cases, case)()


def test_plans_need_no_tensorflow():
  out = run_without_tensorflow(
      "import sys; sys.path.insert(0, 'tests/plans')\n"
      "import plan_cases\n"
      "for c in plan_cases.CASES: getattr(plan_cases, c)()\n"
      "print(len(plan_cases.CASES))")
  assert int(out) == len(plan_cases.CASES) >= 10
