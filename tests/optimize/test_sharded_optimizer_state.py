"""shard_optimizer_state=True: slots split over the data-parallel mesh axis, same numbers.

Each case trains the toy model of sharded_state_testing for 2 steps with and without
sharding on one backend and layout, and checks: equal losses and variables (slots
included; 1e-6), the optimizer-state bytes each device holds (counted from the
backend's TF variables) divided by the data-parallel degree for the slots with a
divisible dim, and unchanged where no dim divides.
"""
import collections

import pytest

import sharded_state_testing as st

BACKENDS = ["placement", "simd", "gspmd"]


@pytest.fixture(scope="module")
def single_device():
  return st.ToyModel(st.adam(False)).train(st.make_impl("placement", ""), steps=2)


@pytest.fixture(scope="module")
def runs():
  """{(backend, layout, shard): (train result, bytes per device of the slots)}."""
  return {}


def _run(runs, backend, layout, shard):
  key = (backend, layout, shard)
  if key not in runs:
    model = st.ToyModel(st.adam(shard))
    impl = st.make_impl(backend, layout)
    result = model.train(impl, steps=2)
    slot_bytes = {n: st.bytes_per_device(impl, [n]) for n in model.slot_names}
    runs[key] = result, slot_bytes
  return runs[key]


@pytest.mark.parametrize("layout", list(st.LAYOUTS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_numbers_as_unsharded(runs, single_device, backend, layout):
  sharded, _ = _run(runs, backend, layout, True)
  unsharded, _ = _run(runs, backend, layout, False)
  st.assert_same(sharded, unsharded, 1e-6, "%s %s sharded vs unsharded" % (backend, layout))
  # and both train as on one device (a split contraction sums in another order)
  st.assert_same(sharded, single_device, 2e-5, "%s %s vs one device" % (backend, layout))
  assert sharded[0][-1] < sharded[0][0] * 0.75  # it trains


@pytest.mark.parametrize("layout", list(st.LAYOUTS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_slot_bytes_per_device_divided_by_dp_degree(runs, backend, layout):
  _, sharded = _run(runs, backend, layout, True)
  _, unsharded = _run(runs, backend, layout, False)
  dp = st.DP_DEGREE[layout]
  mp_split_all = layout == "dp+mp"  # b1 [hidden]: its one dim is on the model axis
  for name in sharded:
    ratio = max(unsharded[name].values()) / max(sharded[name].values())
    divisible = not name.startswith("odd") and not (mp_split_all and name.startswith("b1"))
    assert ratio == (dp if divisible else 1), (name, unsharded[name], sharded[name])
  # All slots together: the most any device holds shrinks (on placement with shared
  # host memory the replicas of a slice are one variable, on the first device of their
  # group, so unsharded state sits on a few devices and sharded state on all eight).
  by_device = lambda per_slot: sum((collections.Counter(b) for b in per_slot.values()),
                                   collections.Counter())
  assert max(by_device(sharded).values()) < max(by_device(unsharded).values())
  if backend == "placement":
    assert len(by_device(sharded)) == 8
