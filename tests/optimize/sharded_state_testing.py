"""Helpers for the sharded-optimizer-state tests: a toy regression model trained with an
optimizer eagerly on any backend, and the optimizer-state bytes each device holds,
counted from the backend's own TF variables."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends.simd import SimdMeshImpl

CPUS = ["/cpu:%d" % i for i in range(8)]
BATCH = mtf.Dimension("batch", 8)
D_IN = mtf.Dimension("d_in", 8)
HIDDEN = mtf.Dimension("hidden", 16)
D_OUT = mtf.Dimension("d_out", 8)
ODD = mtf.Dimension("odd", 5)  # divisible by no data-parallel degree used here

LAYOUTS = {
    "dp": ("all:8", "batch:all"),
    "dp+mp": ("rows:2;cols:4", "batch:rows;hidden:cols"),
}
DP_DEGREE = {"dp": 8, "dp+mp": 2}

_RNG = np.random.RandomState(0)
X = _RNG.randn(8, 8).astype(np.float32)
TARGETS = _RNG.randn(8, 8).astype(np.float32)


def make_impl(backend, layout_name):
  """A fresh MeshImpl of backend for one of LAYOUTS ("" layout_name: one device)."""
  if not layout_name:
    return mtf.PlacementMeshImpl("", "", [""])
  mesh_shape, rules = LAYOUTS[layout_name]
  if backend == "placement":
    return mtf.PlacementMeshImpl(mesh_shape, rules, CPUS)
  if backend == "simd":
    return SimdMeshImpl(mesh_shape, rules)
  if backend == "gspmd":
    return mtf.GSPMDMeshImpl(mesh_shape, rules)
  raise ValueError(backend)


class ToyModel:
  """relu MLP regression [batch, d_in] -> [batch, d_out] plus an odd-sized variable.

  Variables: w1 [d_in, hidden], b1 [hidden], w2 [hidden, d_out], odd [odd] (its only
  gradient is from an L2 term, so it owes no allreduce).
  """

  def __init__(self, make_optimizer):
    self.graph = mtf.Graph()
    self.mesh = mtf.Mesh(self.graph, "m")
    x = mtf.import_tf_tensor(self.mesh, tf.constant(X), [BATCH, D_IN])
    t = mtf.import_tf_tensor(self.mesh, tf.constant(TARGETS), [BATCH, D_OUT])
    init = tf.random_normal_initializer(stddev=0.5, seed=1)
    w1 = mtf.get_variable(self.mesh, "w1", [D_IN, HIDDEN], initializer=init)
    b1 = mtf.get_variable(self.mesh, "b1", [HIDDEN], initializer=init)
    w2 = mtf.get_variable(self.mesh, "w2", [HIDDEN, D_OUT], initializer=init)
    odd = mtf.get_variable(self.mesh, "odd", [ODD], initializer=init)
    h = mtf.relu(mtf.einsum([x, w1], output_shape=[BATCH, HIDDEN]) + b1)
    y = mtf.einsum([h, w2], output_shape=[BATCH, D_OUT])
    self.loss = (mtf.reduce_mean(mtf.square(y - t)) +
                 mtf.reduce_sum(mtf.square(odd)) * 0.01)
    variables = self.graph.trainable_variables
    grads = mtf.gradients([self.loss], [v.outputs[0] for v in variables])
    self.update_ops = make_optimizer().apply_grads(grads, variables)

  @property
  def slot_names(self):
    """Names of the optimizer's slot variables."""
    return sorted(v.name for v in self.graph.all_variables if not v.trainable)

  def train(self, impl, steps=3):
    """Runs `steps` eager steps on impl; returns (losses before each step, {variable
    name: full value after them}), slots included."""
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    mtf.optimize.set_global_step(global_step)
    losses = []
    for _ in range(steps):
      lowering = mtf.Lowering(self.graph, {self.mesh: impl})
      losses.append(lowering.export_to_tf_tensor(self.loss).numpy())
      for op in self.update_ops:
        lowering.lowered_operation(op)
      global_step.assign_add(1)
    values = {name: v.read_full().numpy() for name, v in impl.variable_store.items()}
    return np.array(losses), values


def _nbytes(shape, dtype):
  return int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(dtype).size


def bytes_per_device(impl, names):
  """{device or core: bytes of the named variables it holds}, from the TF variables.

  placement: the distinct tf.Variables by their `.device` (replicas of one slice on
    shared host memory are one variable, on the first of their devices);
  simd (CPU emulation): each core's slice, the trailing dims of the one compact
    variable (its leading dims index the distinct slices);
  gspmd: each device's shard of the full variable under the OpSharding it is annotated
    with (the tile counts per dim).
  """
  out = {}
  for name in names:
    v = impl.variable_store[name]
    if isinstance(impl, mtf.PlacementMeshImpl):
      seen = {}
      for sv in v.slice_variables:
        seen[id(sv)] = sv
      for sv in seen.values():
        dev = tf.DeviceSpec.from_string(sv.device).replace(job=None, replica=None,
                                                           task=None).to_string()
        out[dev] = out.get(dev, 0) + _nbytes(sv.shape.as_list(), sv.dtype)
    elif isinstance(impl, SimdMeshImpl):
      shape = v.variable.shape.as_list()[len(v.extents):]
      for core in range(impl.size):
        out[core] = out.get(core, 0) + _nbytes(shape, v.variable.dtype)
    else:
      full = v.variable.shape.as_list()
      tiles = list(v.sharding.tile_assignment_dimensions) or [1] * len(full)
      shard = [s // t for s, t in zip(full, tiles)]
      for core in range(impl.size):
        out[core] = out.get(core, 0) + _nbytes(shard, v.variable.dtype)
  return out


def adam(shard):
  """A factory of the toy runs' Adam optimizer, with or without split state."""
  return lambda: mtf.optimize.AdamWeightDecayOptimizer(
      0.05, weight_decay_rate=0.01, shard_optimizer_state=shard)


def assert_same(got, want, tol, what):
  """Two (losses, {variable: value}) results of ToyModel.train agree within tol."""
  (losses, values), (ref_losses, ref_values) = got, want
  np.testing.assert_allclose(losses, ref_losses, rtol=tol, atol=tol,
                             err_msg="%s: losses" % what)
  assert sorted(values) == sorted(ref_values)
  for name in values:
    np.testing.assert_allclose(values[name], ref_values[name], rtol=tol, atol=tol,
                               err_msg="%s: variable %s" % (what, name))
