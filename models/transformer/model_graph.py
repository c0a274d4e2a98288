"""`ModelGraph`: a Transformer model's mtf graph for one mode, built once: int32
[batch, length] feature placeholders in, the loss (and, when training, the optimizer's
update ops) out.
"""
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import LayoutError
from models.transformer import model_layout
from models.transformer import transformer
from models.transformer.context import ModeKeys

# Feature keys a model may read; anything else in a dataset is ignored.
FEATURE_KEYS = ("inputs", "targets", "inputs_segmentation", "inputs_position",
                "targets_segmentation", "targets_position", "targets_subsegmentation")

# Dim names of the Transformer family: layouts may name them even when a given model
# lacks them (e.g. "experts:batch" in a layout shared by dense and MoE models).
STANDARD_DIM_NAMES = ("batch", "length", "memory_length", "d_model", "heads", "d_kv",
                      "d_ff", "vocab", "experts", "expert_hidden", "beam", "outer_batch",
                      "inner_batch", "ensemble", "memory_heads", "kv_heads")


def feature_length(sequence_length, key):
  """The length of feature key: sequence_length is an int or a dict by feature name."""
  if isinstance(sequence_length, dict):
    base = key.split("_")[0]
    if base not in sequence_length:
      raise mtf.MtfError("sequence_length %r has no entry for feature %r"
                         % (sequence_length, base))
    return int(sequence_length[base])
  return int(sequence_length)


def is_bitransformer(model):
  """Whether model is an encoder-decoder (has an encoder and a decoder)."""
  return hasattr(model, "encoder") and hasattr(model, "decoder")


def model_type_of(model):
  """The model_type utils.build_model gave model; else "bitransformer" or "lm"."""
  given = getattr(model, "model_type", None)
  return given or ("bitransformer" if is_bitransformer(model) else "lm")


def reads_inputs(model):
  """Whether model reads an "inputs" feature (all types but "lm")."""
  return is_bitransformer(model) or model_type_of(model) in ("delimited_lm", "aligned")


def model_features(model, feature_keys):
  """The feature keys this model reads, in FEATURE_KEYS order."""
  wanted = set(feature_keys) & set(FEATURE_KEYS)
  if not reads_inputs(model):
    wanted -= {"inputs", "inputs_segmentation", "inputs_position"}
  if "targets" not in wanted:
    raise mtf.MtfError("the dataset has no 'targets' feature (it has %s)"
                       % sorted(feature_keys))
  if is_bitransformer(model) and "inputs" not in wanted:
    raise mtf.MtfError("an encoder-decoder model needs an 'inputs' feature; the dataset "
                       "has %s" % sorted(feature_keys))
  model_type = model_type_of(model)
  if model_type in ("delimited_lm", "aligned") and "inputs" not in wanted:
    raise mtf.MtfError(
        "model_type %r needs a dataset of 'inputs' and 'targets' (text2text); this one "
        "has %s (model_type 'lm' trains on 'targets' alone)"
        % (model_type, sorted(feature_keys)))
  return [k for k in FEATURE_KEYS if k in wanted]


def model_view(model, features):
  """The features as the model reads them (a "delimited_lm"'s as text2self sequences)."""
  if model_type_of(model) != "delimited_lm" or "inputs" not in features:
    return features
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  text2text = {k: v for k, v in features.items() if k != "targets_subsegmentation"}
  return utils._dynamic_text2self(text2text)  # pylint: disable=protected-access


def counted_positions(model, targets):
  """float32 mtf mask of the target positions eval metrics and scores count: not padding
  and, for a "delimited_lm", not the inputs part (up to the first EOS)."""
  weights = mtf.cast(mtf.greater(targets, 0), tf.float32)
  if model_type_of(model) == "delimited_lm":
    weights *= mtf.cast(mtf.logical_not(transformer.delimited_lm_inputs_mask(targets)),
                        tf.float32)
  return weights


def call_model(model, features, mode, variable_dtype, num_microbatches=1):
  """(logits, loss) of model on a dict of mtf features (the original model_fn's call);
  a "delimited_lm"'s text2text features are converted first (model_view)."""
  features = model_view(model, features)
  targets = features["targets"]
  if is_bitransformer(model):
    return model.call_simple(
        inputs=features["inputs"], targets=targets, compute_loss=True, mode=mode,
        variable_dtype=variable_dtype,
        encoder_sequence_id=features.get("inputs_segmentation"),
        decoder_sequence_id=features.get("targets_segmentation"),
        decoder_subsequence_id=features.get("targets_subsegmentation"),
        encoder_position=features.get("inputs_position"),
        decoder_position=features.get("targets_position"),
        num_microbatches=num_microbatches)
  sequence_id = features.get("targets_segmentation")
  if model_type_of(model) == "aligned":
    inputs = features["inputs"]
    if inputs.shape != targets.shape:
      raise mtf.MtfError(
          "model_type 'aligned' needs inputs and targets of one length, aligned "
          "position by position; got inputs %s and targets %s (set sequence_length to "
          "one int or equal 'inputs' and 'targets' lengths)"
          % (inputs.shape.to_string, targets.shape.to_string))
  else:
    inputs = transformer.autoregressive_inputs(targets, sequence_id=sequence_id)
  return model.call_simple(
      inputs=inputs, targets=targets, compute_loss=True, mode=mode,
      variable_dtype=variable_dtype, sequence_id=sequence_id,
      subsequence_id=features.get("targets_subsegmentation"),
      position=features.get("targets_position"), num_microbatches=num_microbatches)


class ModelGraph:
  """The mtf graph of one model call on one batch shape (ModeKeys.TRAIN: with the
  optimizer's update ops).

  Attributes: graph, mesh, loss, logits, update_ops, placeholders (key -> mtf Tensor),
  targets (what the logits predict: a "delimited_lm"'s [inputs, targets] sequences) and
  weights (counted_positions of targets).
  """

  def __init__(self, model, batch_size, sequence_length, feature_keys, mode,
               variable_dtype, optimizer=None, num_microbatches=1):
    self.model = model
    self.mode = mode
    self.batch_size = batch_size
    self.graph = mtf.Graph()
    self.mesh = mtf.Mesh(self.graph, "my_mesh")
    self.keys = model_features(model, feature_keys)
    batch_dim = mtf.Dimension("batch", batch_size)
    self.placeholders = {}
    for key in self.keys:
      length = feature_length(sequence_length, key)
      self.placeholders[key] = mtf.import_tf_tensor(
          self.mesh, tf.TensorSpec([batch_size, length], tf.int32),
          [batch_dim, mtf.Dimension("length", length)], name=key)
    features = model_view(model, self.placeholders)
    self.targets = features["targets"]
    self.weights = counted_positions(model, self.targets)
    self.logits, loss = call_model(model, features, mode, variable_dtype,
                                   num_microbatches)
    self.loss = mtf.cast(loss, tf.float32)
    self.update_ops = []
    if mode == ModeKeys.TRAIN:
      variables = self.graph.trainable_variables
      grads = mtf.gradients([self.loss], [v.outputs[0] for v in variables])
      self.update_ops = optimizer.apply_grads(grads, variables)

  def tokens_per_batch(self):
    """Number of target positions in one batch (the model's view of them)."""
    return self.targets.shape.size

  def lowering(self, mesh_impl, features=None):
    """A Lowering on mesh_impl fed with a dict of features (None: variables only); a
    LayoutError if the model was built for another layout."""
    model_layout.check_agrees(self.model, mesh_impl)
    feeds = {}
    if features is not None:
      feeds = {self.placeholders[k]: features[k] for k in self.keys}
    return mtf.Lowering(self.graph, {self.mesh: mesh_impl}, feeds=feeds)

  def dim_names(self):
    """The names of every dim of every tensor in the graph, sorted."""
    return sorted({d.name for op in self.graph.operations for t in op.outputs
                   for d in t.shape.dims})


def check_layout_names(model_graph, mesh_layout):
  """Raises LayoutError for a rule of mesh_layout naming a dim the model lacks; returns
  the rules that split nothing (naming a mesh dim the mesh lacks, or a standard
  Transformer dim this model does not use)."""
  mesh_dims = mesh_layout.shape.dimension_names
  dims = set(model_graph.dim_names())
  unused = []
  for tensor_dim, mesh_dim in mesh_layout.layout_rules:
    rule = "%s:%s" % (tensor_dim, mesh_dim)
    if tensor_dim not in dims and tensor_dim not in STANDARD_DIM_NAMES:
      raise LayoutError(
          "layout rule %r names dim %r, which the model lacks; the model's dims are %s"
          % (rule, tensor_dim, ", ".join(sorted(dims))), rule=rule, dim=tensor_dim)
    if tensor_dim not in dims or mesh_dim not in mesh_dims:
      unused.append(rule)
  return unused
