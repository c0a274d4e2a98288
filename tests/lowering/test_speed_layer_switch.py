"""The speed layer's switch (mesh_tf/lowering/speed_layer.py): the environment variable,
the gin setting and the context manager; the plain path it leaves, which computes the
same values with public TF calls only; and the fallback, with one warning, where TF
lacks an internal the layer needs (simulated here)."""
import importlib
import warnings

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends import simd_vectorize, slice_replay, slice_segments
from mesh_tf.lowering import direct_ops, speed_layer
from mesh_tf.lowering.mesh_impl import MeshImpl

DEVICES = ["/cpu:%d" % i for i in range(4)]


@pytest.fixture(autouse=True)
def _fresh_switch(monkeypatch):
  """Each test starts from the default (no environment variable, no override) and leaves
  the caches to be filled again from what the session set."""
  monkeypatch.delenv(speed_layer.ENV_VAR, raising=False)
  speed_layer.set_enabled(None)
  speed_layer.reset()
  yield
  speed_layer.set_enabled(None)
  speed_layer.reset()


def _model(mesh_impl):
  """(a function lowering a small two-layer model, its expected value)."""
  x_np = np.linspace(-1.0, 1.0, 4 * 6, dtype=np.float32).reshape(4, 6)
  w_np = np.linspace(0.5, -0.5, 6 * 8, dtype=np.float32).reshape(6, 8)
  want = np.sum(np.tanh(x_np @ w_np * 0.5 + 1.0) ** 2, axis=1)

  def run():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    batch, hidden, out = (mtf.Dimension("batch", 4), mtf.Dimension("hidden", 6),
                          mtf.Dimension("out", 8))
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), mtf.Shape([batch, hidden]))
    w = mtf.import_tf_tensor(mesh, tf.constant(w_np), mtf.Shape([hidden, out]))
    y = mtf.tanh(mtf.einsum([x, w], output_shape=[batch, out]) * 0.5 + 1.0)
    z = mtf.reduce_sum(mtf.square(y), reduced_dim=out)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl()})
    return lowering.export_to_tf_tensor(z)
  return run, want


def _placement():
  return mtf.PlacementMeshImpl("a:2;b:2", "batch:a;out:b", DEVICES)


def _simd():
  return mtf.SimdMeshImpl("a:2;b:2", "batch:a;out:b")


def _traced_value(run):
  return tf.function(run, autograph=False)().numpy()


def test_default_is_on():
  assert speed_layer.switch_setting() is True
  assert speed_layer.enabled()
  assert speed_layer.active() is not None


@pytest.mark.parametrize("value,on", [("0", False), ("1", True), ("off", False),
                                      ("false", False), ("", True)])
def test_environment_variable(monkeypatch, value, on):
  monkeypatch.setenv(speed_layer.ENV_VAR, value)
  assert speed_layer.enabled() is on


def test_a_lowering_reads_the_environment_again(monkeypatch):
  assert speed_layer.enabled()
  monkeypatch.setenv(speed_layer.ENV_VAR, "0")
  assert speed_layer.enabled()  # cached until something asks again
  run, _ = _model(_placement)
  run()  # mtf.Lowering refreshes the switch
  assert not speed_layer.enabled()
  monkeypatch.setenv(speed_layer.ENV_VAR, "1")
  speed_layer.refresh()
  assert speed_layer.enabled()


def test_gin_setting():
  try:
    gin.parse_config("speed_layer.enabled = False")
    speed_layer.refresh()
    assert not speed_layer.enabled()
  finally:
    gin.clear_config()
  speed_layer.refresh()
  assert speed_layer.enabled()


def test_the_environment_overrides_gin_and_the_override_both(monkeypatch):
  monkeypatch.setenv(speed_layer.ENV_VAR, "0")
  try:
    gin.parse_config("speed_layer.enabled = True")
    assert speed_layer.switch_setting() is False
    with speed_layer.switched(True):
      assert speed_layer.enabled()
    assert not speed_layer.enabled()
  finally:
    gin.clear_config()


def test_context_managers_restore_the_setting():
  with speed_layer.disabled():
    assert not speed_layer.enabled()
    with speed_layer.switched(True):
      assert speed_layer.enabled()
    assert not speed_layer.enabled()
  assert speed_layer.enabled()


def test_off_no_op_is_made_directly():
  with speed_layer.disabled():

    @tf.function(autograph=False)
    def f(x):
      assert direct_ops.graph_for(x) is None
      return direct_ops.transpose(x, [1, 0])
    np.testing.assert_array_equal(f(tf.ones([2, 3])).numpy(), np.ones([3, 2]))

  @tf.function(autograph=False)
  def g(x):
    assert direct_ops.graph_for(x) is not None
    return x
  g(tf.ones([1]))


@pytest.mark.parametrize("mesh_impl", [_placement, _simd], ids=["placement", "simd"])
def test_plain_path_computes_what_the_speed_layer_does(mesh_impl):
  run, want = _model(mesh_impl)
  with speed_layer.switched(True):
    on = _traced_value(run)
  before = (dict(slice_segments.stats), dict(slice_replay.stats), dict(simd_vectorize.stats))
  with speed_layer.disabled():
    off = _traced_value(run)
    eager_off = run().numpy()
  after = (dict(slice_segments.stats), dict(slice_replay.stats), dict(simd_vectorize.stats))
  np.testing.assert_allclose(on, want, rtol=1e-5)
  np.testing.assert_allclose(off, want, rtol=1e-5)
  np.testing.assert_allclose(eager_off, want, rtol=1e-5)
  # off, nothing was deferred, recorded, replayed or traced in a FuncGraph
  assert before[0] == after[0]
  for key in ("recorded", "replayed"):
    assert before[1].get(key) == after[1].get(key)
  for key in ("replay", "trace_reused"):
    assert before[2].get(key) == after[2].get(key)
  if mesh_impl is _simd:  # every slice function on tf.vectorized_map
    plain = after[2]["plain"] - before[2].get("plain", 0)
    assert plain > 0
    assert after[2]["vectorized_map"] - before[2].get("vectorized_map", 0) == plain


def _simulate_missing(monkeypatch, missing_module=None, missing_graph_attr=None):
  """Makes the probe find an internal missing, as a TF release that moved it would."""
  if missing_module is not None:
    real = importlib.import_module

    def import_module(name, *args, **kwargs):
      if name == missing_module:
        raise ImportError("No module named %r" % name)
      return real(name, *args, **kwargs)
    monkeypatch.setattr(speed_layer.importlib, "import_module", import_module)
  if missing_graph_attr is not None:
    monkeypatch.setattr(speed_layer, "_GRAPH_ATTRS",
                        speed_layer._GRAPH_ATTRS + (missing_graph_attr,))
  speed_layer.reset()


@pytest.mark.parametrize("missing", [
    dict(missing_module="tensorflow.python.eager.record"),
    dict(missing_module="tensorflow.python.eager.polymorphic_function.atomic_function"),
    dict(missing_graph_attr="_create_op_internal_v2")])
def test_a_missing_internal_falls_back_with_one_warning(monkeypatch, missing):
  _simulate_missing(monkeypatch, **missing)
  name = missing.get("missing_module") or "tf.Graph." + missing["missing_graph_attr"]
  with pytest.warns(speed_layer.SpeedLayerFallbackWarning) as record:
    assert not speed_layer.enabled()
  assert len(record) == 1
  message = str(record[0].message)
  assert message == ("mesh_tf: TensorFlow %s lacks %s; using the plain lowering path "
                     "(slower)" % (tf.__version__, name)), message
  assert "\n" not in message
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no second warning, whatever asks
    assert not speed_layer.enabled()
    assert speed_layer.internals() is None
    speed_layer.refresh()
    for mesh_impl in (_placement, _simd):
      run, want = _model(mesh_impl)
      before = dict(slice_segments.stats)
      np.testing.assert_allclose(_traced_value(run), want, rtol=1e-5)
      assert dict(slice_segments.stats) == before
    # the switch cannot turn on what TF lacks
    with speed_layer.switched(True):
      assert not speed_layer.enabled()


def test_a_changed_internal_falls_back_too(monkeypatch):
  """An internal present but unusable (here: the probe itself raising) counts as
  missing."""
  def broken():
    raise TypeError("AtomicFunction.__init__() takes 2 positional arguments")
  monkeypatch.setattr(speed_layer, "_probe", broken)
  speed_layer.reset()
  with pytest.warns(speed_layer.SpeedLayerFallbackWarning, match="TypeError"):
    assert not speed_layer.enabled()


def test_the_reader_hook_is_a_no_op_by_default_and_placement_notes_it():
  assert MeshImpl.note_readers(None, object(), lambda: True) is None
  impl = _placement()
  laid_out = impl.LaidOutTensor([tf.zeros([1])] * 4)
  assert laid_out.read_later()
  impl.note_readers(laid_out, lambda: False)
  assert not laid_out.read_later()
