"""Skips the tests of the speed layer itself where it is off (tests/speed_layer_only.py)."""
import pytest

import speed_layer_only


@pytest.fixture(autouse=True)
def _speed_layer_tests_need_it_on(request):
  speed_layer_only.skip_if_off(request.node)
