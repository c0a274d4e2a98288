"""Models for the GSPMD tests: an MLP and one Transformer layer, with SGD steps.

Both are written with core mtf ops only (einsum, relu, softmax, reductions), built once
with placeholders, and lowered on any MeshImpl by `make_step`. Layout cases name the
2x4 mesh "rows:2;cols:4" with data parallelism on rows and model parallelism on cols.
"""
import collections

import numpy as np
import tensorflow as tf

import mesh_tf as mtf

MESH_SHAPE = "rows:2;cols:4"
LEARNING_RATE = 0.1

# name -> layout rules, for each model.
MLP_LAYOUTS = collections.OrderedDict([
    ("dp", "batch:rows"),
    ("mp", "hidden:cols"),
    ("dp_mp", "batch:rows;hidden:cols"),
])
TRANSFORMER_LAYOUTS = collections.OrderedDict([
    ("dp", "batch:rows"),
    ("mp", "heads:cols;d_ff:cols"),
    ("dp_mp", "batch:rows;heads:cols;d_ff:cols"),
])


class Model:
  """A built graph: placeholders, loss, variables, their gradients and the SGD update."""

  def __init__(self, graph, mesh, inputs, loss, variables):
    self.graph = graph
    self.mesh = mesh
    self.inputs = inputs  # list of (placeholder Tensor, numpy value)
    self.loss = loss
    self.variables = variables
    self.grads = mtf.gradients([loss], variables)
    self.update_ops = [mtf.assign(v, v - g * LEARNING_RATE)
                       for v, g in zip(variables, self.grads)]

  @property
  def variable_names(self):
    return [v.operation.name for v in self.variables]

  def input_values(self):
    return [value for _, value in self.inputs]

  def einsum_outputs(self):
    """The output of every einsum the training step runs (forward and backward)."""
    needed, stack = set(), [t.operation for t in [self.loss] + self.grads] + self.update_ops
    while stack:
      op = stack.pop()
      if op not in needed:
        needed.add(op)
        stack.extend(x.operation for x in op.inputs)
    return [op.outputs[0] for op in self.graph.operations
            if op in needed and isinstance(op, mtf.EinsumOperation)]


def _placeholder(mesh, name, value, shape):
  spec = tf.TensorSpec(value.shape, tf.as_dtype(value.dtype))
  return mtf.import_tf_tensor(mesh, spec, shape, name=name), value


def build_mlp(batch=8, features=12, hidden=16, classes=4, seed=0):
  """x[batch, features] -> relu(. w1) w2 -> softmax cross-entropy against labels."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mlp_mesh")
  batch_d, features_d = mtf.Dimension("batch", batch), mtf.Dimension("features", features)
  hidden_d, classes_d = mtf.Dimension("hidden", hidden), mtf.Dimension("classes", classes)
  rng = np.random.RandomState(seed)
  x, x_value = _placeholder(mesh, "x", rng.randn(batch, features).astype(np.float32),
                            [batch_d, features_d])
  labels, labels_value = _placeholder(
      mesh, "labels", rng.randint(0, classes, size=[batch]).astype(np.int32), [batch_d])
  w1 = mtf.get_variable(mesh, "w1", [features_d, hidden_d])
  w2 = mtf.get_variable(mesh, "w2", [hidden_d, classes_d])
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch_d, hidden_d]))
  logits = mtf.einsum([h, w2], output_shape=[batch_d, classes_d])
  target_logit = mtf.reduce_sum(logits * mtf.one_hot(labels, classes_d), reduced_dim=classes_d)
  loss = mtf.reduce_mean(mtf.reduce_logsumexp(logits, classes_d) - target_logit)
  return Model(graph, mesh, [(x, x_value), (labels, labels_value)], loss, [w1, w2])


def build_transformer_layer(batch=4, length=4, d_model=8, heads=4, d_kv=4, d_ff=16,
                            seed=0):
  """One pre-residual self-attention + ReLU feed-forward block; loss = mean square."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "transformer_mesh")
  batch_d, length_d = mtf.Dimension("batch", batch), mtf.Dimension("length", length)
  memory_d = mtf.Dimension("memory_length", length)
  model_d, heads_d = mtf.Dimension("d_model", d_model), mtf.Dimension("heads", heads)
  kv_d, ff_d = mtf.Dimension("d_kv", d_kv), mtf.Dimension("d_ff", d_ff)
  rng = np.random.RandomState(seed)
  x_in, x_value = _placeholder(
      mesh, "x", rng.randn(batch, length, d_model).astype(np.float32),
      [batch_d, length_d, model_d])
  wq, wk, wv = [mtf.get_variable(mesh, n, [model_d, heads_d, kv_d]) for n in "qkv"]
  wo = mtf.get_variable(mesh, "o", [heads_d, kv_d, model_d])
  w_in = mtf.get_variable(mesh, "ff_in", [model_d, ff_d])
  w_out = mtf.get_variable(mesh, "ff_out", [ff_d, model_d])

  q = mtf.einsum([x_in, wq], output_shape=[batch_d, heads_d, length_d, kv_d])
  memory = mtf.rename_dimension(x_in, "length", "memory_length")
  k = mtf.einsum([memory, wk], output_shape=[batch_d, heads_d, memory_d, kv_d])
  v = mtf.einsum([memory, wv], output_shape=[batch_d, heads_d, memory_d, kv_d])
  scores = mtf.einsum([q, k], output_shape=[batch_d, heads_d, length_d, memory_d])
  weights = mtf.softmax(scores * (d_kv ** -0.5), memory_d)
  attended = mtf.einsum([weights, v], output_shape=[batch_d, heads_d, length_d, kv_d])
  x = x_in + mtf.einsum([attended, wo], output_shape=[batch_d, length_d, model_d])
  hidden = mtf.relu(mtf.einsum([x, w_in], output_shape=[batch_d, length_d, ff_d]))
  y = x + mtf.einsum([hidden, w_out], output_shape=[batch_d, length_d, model_d])
  loss = mtf.reduce_mean(mtf.square(y))
  return Model(graph, mesh, [(x_in, x_value)], loss, [wq, wk, wv, wo, w_in, w_out])


BUILDERS = {"mlp": (build_mlp, MLP_LAYOUTS),
            "transformer": (build_transformer_layer, TRANSFORMER_LAYOUTS)}


def make_step(model, mesh_impl, jit_compile=False, update=True):
  """A tf.function(*inputs) -> (loss, *grads) that also applies the SGD update."""
  placeholders = [p for p, _ in model.inputs]
  mtf.Lowering(model.graph, {model.mesh: mesh_impl})  # creates the variables eagerly

  @tf.function(jit_compile=jit_compile, autograph=False)
  def step(*values):
    lowering = mtf.Lowering(model.graph, {model.mesh: mesh_impl},
                            feeds=dict(zip(placeholders, values)))
    outs = [lowering.export_to_tf_tensor(t) for t in [model.loss] + model.grads]
    if update:
      for op in model.update_ops:
        lowering.lowered_operation(op)
    return outs
  return step


def eager_step(model, mesh_impl):
  """Lowers (so runs) one step eagerly: [loss, *grads] as tf.Tensors, after updating."""
  lowering = mtf.Lowering(model.graph, {model.mesh: mesh_impl},
                          feeds={p: v for p, v in model.inputs})
  outs = [lowering.export_to_tf_tensor(t) for t in [model.loss] + model.grads]
  for op in model.update_ops:
    lowering.lowered_operation(op)
  return outs


def run_step(model, mesh_impl, jit_compile=False, eager=False):
  """One step: ([loss, *grads] as numpy, {variable name: value after the update})."""
  if eager:
    outs = [o.numpy() for o in eager_step(model, mesh_impl)]
  else:
    step = make_step(model, mesh_impl, jit_compile=jit_compile)
    outs = [o.numpy() for o in step(*model.input_values())]
  after = {name: mesh_impl.variable_store[name].read_full().numpy()
           for name in model.variable_names}
  return outs, after
