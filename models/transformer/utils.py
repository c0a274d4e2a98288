"""The trainer's entry points (the original's transformer/utils.py), gin module "utils".

`run` is what `main.py` calls: it builds the mesh and the model from gin and runs one
mode -- "train", "eval" (alias "perplexity_eval"), "decode" or "export". Everything else
here is a helper the original offered under the same name.
"""
import contextlib
import functools
import math
import os

import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.checkpoint import discovery, step_from_prefix
from mesh_tf.errors import MtfError
from mesh_tf.shapes import MeshLayout
from models.transformer.trainer import auto_layout
from models.transformer.trainer import decode_io
from models.transformer.trainer.decode_io import clean_decodes  # the original's utils name
from models.transformer.trainer import model_dir_guard
from models.transformer.trainer import run_config

# The original's entry points (they take the MeshEstimator of get_estimator).
from models.transformer.trainer.entry_points import (
    compute_log_likelihoods, decode, decode_from_dataset, decode_from_file,
    encode_delimited_lm, encode_inputs, eval_model, export_model,
    flexible_ckpt_init_mapping, get_estimator, infer_model, save_scores,
    save_scores_to_tfrecords, score_from_dataset, score_from_strings,
    score_with_estimator, score_with_estimator_lazy, train_model)


MODES = ("train", "eval", "perplexity_eval", "decode", "export")


@gin.configurable(module="utils")
def get_variable_dtype(master_dtype=tf.bfloat16, slice_dtype=tf.float32,
                       activation_dtype=tf.float32):
  """The mtf.VariableDType of the model's variables (dtypes as names or tf.DTypes)."""
  return mtf.VariableDType(master_dtype=tf.as_dtype(master_dtype),
                           slice_dtype=tf.as_dtype(slice_dtype),
                           activation_dtype=tf.as_dtype(activation_dtype))


MODEL_TYPES = ("bitransformer", "lm", "delimited_lm", "aligned", "bi_student_teacher")


@gin.configurable(module="utils")
def build_model(model_type="bitransformer", input_vocab_size=gin.REQUIRED,
                output_vocab_size=gin.REQUIRED, layout_rules=None, mesh_shape=None):
  """The model of model_type, which the returned model keeps as `model.model_type`.

  "bitransformer": an encoder-decoder (inputs -> targets). "lm": an autoregressive
  Unitransformer on "targets". "delimited_lm": that Unitransformer trained on each
  example as one sequence [inputs, targets], decoding by continuing "inputs EOS".
  "aligned": a non-autoregressive Unitransformer (like BERT) predicting targets from
  inputs of the same length. "bi_student_teacher": see make_bi_student_teacher.
  """
  from models.transformer import transformer  # pylint: disable=g-import-not-at-top
  if model_type in ("lm", "delimited_lm", "aligned"):
    model = transformer.Unitransformer(
        layer_stack=transformer.make_layer_stack(), input_vocab_size=input_vocab_size,
        output_vocab_size=output_vocab_size, autoregressive=model_type != "aligned",
        layout=layout_rules, mesh_shape=mesh_shape)
  elif model_type == "bitransformer":
    model = transformer.make_bitransformer(
        input_vocab_size=input_vocab_size, output_vocab_size=output_vocab_size,
        layout=layout_rules, mesh_shape=mesh_shape)
  elif model_type == "bi_student_teacher":
    model = transformer.make_bi_student_teacher(
        input_vocab_size=input_vocab_size, output_vocab_size=output_vocab_size,
        layout=layout_rules, mesh_shape=mesh_shape)
  else:
    raise MtfError("unknown model_type %r (utils.run.model_type); use one of %s"
                   % (model_type, ", ".join(repr(t) for t in MODEL_TYPES)))
  # The trainer's graphs (model_graph, decode_io) read the type from the model.
  model.model_type = model_type
  return model


def _max_length(sequence_length):
  if isinstance(sequence_length, dict):
    return max(int(v) for v in sequence_length.values())
  return int(sequence_length)


@gin.configurable(module="utils")
def compute_batch_size(sequence_length, mesh_shape, layout_rules, method_and_value):
  """Sequences per batch, as the original computes it.

  method_and_value is (method, value): "sequences_per_batch", "tokens_per_batch" (tokens
  of targets, which must make whole sequences), "sequences_per_replica" or
  "tokens_per_replica" (per data-parallel replica of the "batch" layout rule).
  """
  try:
    method, value = method_and_value
  except (TypeError, ValueError):
    raise MtfError("batch_size %r is not a (method, value) pair" % (method_and_value,))
  replicas = mtf.tensor_dim_to_mesh_dim_size(layout_rules, mesh_shape,
                                             mtf.Dimension("batch", 0))
  if isinstance(sequence_length, dict):
    if "targets" not in sequence_length:
      raise MtfError("sequence_length %r has no \"targets\" length" % (sequence_length,))
    length = int(sequence_length["targets"])
  else:
    length = int(sequence_length)

  def tokens_to_sequences(tokens):
    if tokens % length:
      raise MtfError("batch_size %r: %d tokens is not a whole number of sequences of "
                     "length %d" % (method_and_value, tokens, length))
    return tokens // length

  if method == "sequences_per_batch":
    size = value
  elif method == "tokens_per_batch":
    size = tokens_to_sequences(value)
  elif method == "sequences_per_replica":
    size = value * replicas
  elif method == "tokens_per_replica":
    size = tokens_to_sequences(value) * replicas
  else:
    raise MtfError("unknown batch size method %r; use sequences_per_batch, "
                   "tokens_per_batch, sequences_per_replica or tokens_per_replica"
                   % (method,))
  if size < 1:
    raise MtfError("batch_size %r gives %d sequences per batch" % (method_and_value, size))
  return size


@gin.configurable(module="utils")
def auto_train_steps(batch_size, sequence_length, train_tokens=2 ** 36):
  """Steps that make train_tokens tokens at this batch size and length."""
  return int(train_tokens) // (batch_size * _max_length(sequence_length))


def get_step_from_checkpoint_path(checkpoint_path):
  """The N of a checkpoint path ending in -N."""
  step = step_from_prefix(os.fspath(checkpoint_path))
  if step is None:
    raise MtfError("checkpoint path %r does not end in -<step>" % (checkpoint_path,),
                   file=checkpoint_path)
  return step


def write_lines_to_file(lines, filename):
  """Writes one line per entry to filename (atomically), creating its directory."""
  from models.transformer.trainer import run_setup  # pylint: disable=g-import-not-at-top
  run_setup.write_text_atomically(filename, "".join("%s\n" % line for line in lines))


def get_inputs_from_file(input_filename, ignore_comments=False):
  """The lines of input_filename (stripped; '#' lines dropped with ignore_comments)."""
  if not tf.io.gfile.exists(input_filename):
    raise MtfError("input file %s does not exist" % input_filename, file=input_filename)
  with tf.io.gfile.GFile(input_filename, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise MtfError("input file %s is not UTF-8 text: byte %d is 0x%02x"
                   % (input_filename, e.start, raw[e.start]), file=input_filename) from None
  lines = [line.strip() for line in text.split("\n")]
  if lines and not lines[-1]:
    lines.pop()
  if ignore_comments:
    lines = [line for line in lines if not line.startswith("#")]
  return lines


def _default_vocabulary():
  from models.transformer import vocabulary as vocabulary_lib  # pylint: disable=g-import-not-at-top
  return vocabulary_lib.ByteVocabulary()


@gin.configurable(module="utils")
def run(tpu_job_name=None, tpu=None, gcp_project=None, tpu_zone=None,
        model_dir=gin.REQUIRED, model_type="bitransformer", vocabulary=None,
        train_dataset_fn=None, eval_dataset_fn=None, dataset_split="train",
        autostack=True, eval_checkpoint_step=None, export_checkpoint_step=None,
        export_path="", mode="train", iterations_per_loop=100,
        save_checkpoints_steps=5000, keep_checkpoint_max=None, eval_summary_dir=None,
        batch_size=("tokens_per_replica", 2048), train_steps=auto_train_steps,
        total_run_steps=None, sequence_length=None, mesh_shape="", mesh_devices=None,
        layout_rules="", learning_rate_schedule=None, optimizer=None, predict_fn=None,
        variable_filter=None, perplexity_eval_steps=100, init_checkpoint=None,
        ensemble_inputs=None, train_model_fn=train_model, skip_seen_data=False,
        seen_data_init_step=0, output_eval_examples=True,
        checkpoint_input_pipeline=False, eval_dir_suffix=None, eval_steps=None,
        decode_input_file=None, decode_output_file=None, num_microbatches=1, seed=0,
        eval_decode_batches=0, skip_nonfinite_updates=False,
        allow_checkpoint_mismatch=False, strict_layout=False):
  """Builds the mesh and model from gin and runs `mode`; returns the mode's result.

  The original's parameters, in its order and with its defaults (gin_configs/
  defaults.gin binds this port's defaults: an LM, 1000 steps, ...), then the port's.

  Args:
    tpu_job_name, gcp_project, tpu_zone, autostack, output_eval_examples: unused.
    tpu: must be None: a TPU runs the library under TPUStrategy (README).
    model_dir: checkpoints, summaries, eval results, operative_config.gin.
    model_type: see build_model.
    vocabulary: a vocabulary object (default ByteVocabulary).
    train_dataset_fn, eval_dataset_fn: fn(sequence_length, vocabulary, dataset_split)
      -> unbatched tf.data.Dataset of int32 feature dicts.
    dataset_split: the split trained on ("train") or evaluated in eval mode.
    eval_checkpoint_step: evaluate or decode this step's checkpoint (default: latest).
    export_path, export_checkpoint_step: where export writes the SavedModel (default
      <model_dir>/export), and which checkpoint it uses.
    mode: "train", "eval" / "perplexity_eval", "decode" or "export".
    iterations_per_loop: steps between progress lines and summaries.
    save_checkpoints_steps, keep_checkpoint_max: checkpoint period and count (None
      keeps all).
    batch_size: (method, value), see compute_batch_size, or an int.
    train_steps: the global step training stops at, or fn(batch_size, sequence_length)
      (auto_train_steps) computing it.
    total_run_steps: the learning-rate schedules' total (default train_steps).
    sequence_length: int, or {"inputs": n, "targets": m}.
    mesh_shape, layout_rules: e.g. "batch:2;model:4", "batch:batch;d_ff:model".
      layout_rules = "auto" lets mtf.auto_mtf choose the rules (and, when mesh_shape is
      a device count such as 8, the mesh shape) for the train step; see auto_layout.py.
    mesh_devices: device names for the mesh (default: the backend's).
    learning_rate_schedule: fn(step, total_train_steps) or a number; None keeps the
      optimizer's default.
    optimizer: an mtf optimizer class (default AdafactorOptimizer).
    perplexity_eval_steps / eval_steps: batches per eval (eval mode / periodic eval
      during training, only when eval_steps is set); see _eval_mode_steps.
    init_checkpoint: weights to start from when model_dir has no checkpoint (see
      should_load_variable and init_checkpoint_variable_mapping).
    eval_summary_dir, predict_fn, variable_filter, ensemble_inputs, train_model_fn,
      skip_seen_data, seen_data_init_step, checkpoint_input_pipeline: the original's
      options this trainer does not offer; a non-default value is an error.
    eval_dir_suffix: eval results go to <model_dir>/eval_<suffix>.
    decode_input_file, decode_output_file: prompts in, text out (decode mode).
    num_microbatches: microbatches per step (default: serialize_num_microbatches).
    seed: seeds TensorFlow's, Python's and numpy's random state before anything is
      built (None: unseeded).
    eval_decode_batches: in eval (and periodic eval), greedily decode this many
      batches of an encoder-decoder model and report exact-match sequence accuracy.
    skip_nonfinite_updates: a NaN/Inf loss stops training with an error; True skips
      that step's update instead.
    allow_checkpoint_mismatch: loading a checkpoint written with another vocabulary or
      model hyperparameters (run_record.py) only warns instead of failing.
    strict_layout: a layout rule naming a mesh dim the mesh lacks is a LayoutError
      instead of a warning.
  """
  del tpu_job_name, gcp_project, tpu_zone, autostack, output_eval_examples
  _refuse_unsupported(tpu=(tpu, None), eval_summary_dir=(eval_summary_dir, None),
                      predict_fn=(predict_fn, None),
                      variable_filter=(variable_filter, None),
                      ensemble_inputs=(ensemble_inputs, None),
                      train_model_fn=(train_model_fn, train_model),
                      skip_seen_data=(skip_seen_data, False),
                      seen_data_init_step=(seen_data_init_step, 0),
                      checkpoint_input_pipeline=(checkpoint_input_pipeline, False))
  from models.transformer.trainer import run_setup  # pylint: disable=g-import-not-at-top
  if mode not in MODES:
    raise MtfError("unknown mode %r; choose one of %s" % (mode, ", ".join(MODES)))
  train_steps, save_checkpoints_steps, iterations_per_loop, eval_steps = (
      run_setup.check_run_parameters(
          model_dir, train_steps, save_checkpoints_steps, iterations_per_loop,
          keep_checkpoint_max, eval_steps, sequence_length, mesh_shape,
          auto_layout=auto_layout.wants_auto(layout_rules)))
  export_path = export_path or None
  with contextlib.ExitStack() as held:
    from models.transformer.trainer import cluster_setup  # pylint: disable=g-import-not-at-top
    replicas = cluster_setup.spmd_replicas()  # None unless a multi-client SPMD run
    if mode == "train" and cluster_setup.claims_model_dir():  # one trainer per model_dir
      held.enter_context(model_dir_guard.claimed_model_dir(model_dir))
    vocabulary = vocabulary if vocabulary is not None else _default_vocabulary()
    if isinstance(batch_size, int):
      batch_size = ("sequences_per_batch", batch_size)
    chosen = ""
    if auto_layout.wants_auto(layout_rules):  # search before anything else is built
      batch_size = compute_batch_size(sequence_length, "", "", batch_size)
      mesh_layout, _ = auto_layout.choose(
          functools.partial(build_model, model_type=model_type,
                            input_vocab_size=decode_io.vocab_size(vocabulary),
                            output_vocab_size=decode_io.vocab_size(vocabulary)),
          mesh_shape, batch_size, sequence_length, get_variable_dtype(), optimizer)
      chosen = auto_layout.bindings_text(mesh_layout)
    else:
      mesh_layout = MeshLayout(mesh_shape, layout_rules)  # the one conversion
    mesh_shape, layout_rules = mesh_layout.shape, mesh_layout.layout_rules
    if not isinstance(batch_size, int):
      batch_size = compute_batch_size(sequence_length, mesh_shape, layout_rules,
                                      batch_size)
    if callable(train_steps):
      train_steps = run_setup.check_train_steps(train_steps(batch_size, sequence_length))
    if num_microbatches == 1:  # the original's gin option, when bound
      num_microbatches = serialize_num_microbatches(
          mtf.Dimension("batch", batch_size), sequence_length, mesh_shape, layout_rules)
    mesh_impl = None if replicas is not None else (
        cluster_setup.strategy_mesh_impl(mesh_layout) or
        run_setup.make_mesh_impl(mesh_layout, mesh_devices))
    run_setup.seed_everything(seed)  # after make_mesh_impl, which may configure devices
    variable_dtype = get_variable_dtype()
    # A fresh model per mtf graph (train, eval, decode): models remember their graph.
    # They get mesh_layout itself, which the MeshImpl keeps as its own.
    model_fn = functools.partial(
        build_model, model_type=model_type,
        input_vocab_size=decode_io.vocab_size(vocabulary),
        output_vocab_size=decode_io.vocab_size(vocabulary), layout_rules=mesh_layout)
    checked = _checked_model_fn(model_fn, batch_size, sequence_length, mesh_layout,
                                strict_layout)
    from models.transformer.trainer import run_record  # pylint: disable=g-import-not-at-top
    held.enter_context(run_record.expecting(  # saved with, and checked on, checkpoints
        run_record.vocabulary_record(vocabulary), checked.model_record(),
        allow_checkpoint_mismatch))
    config = run_config.RunConfig(  # the one value the modes below read
        model_fn=checked, model_dir=model_dir, vocabulary=vocabulary,
        batch_size=batch_size, sequence_length=sequence_length,
        variable_dtype=variable_dtype, dataset_split=dataset_split,
        train_dataset_fn=train_dataset_fn, eval_dataset_fn=eval_dataset_fn,
        train_steps=train_steps, total_run_steps=total_run_steps, optimizer=optimizer,
        learning_rate_schedule=learning_rate_schedule,
        save_checkpoints_steps=save_checkpoints_steps,
        keep_checkpoint_max=keep_checkpoint_max, iterations_per_loop=iterations_per_loop,
        eval_steps=(eval_steps if mode == "train" else
                    _eval_mode_steps(perplexity_eval_steps, eval_steps)),
        init_checkpoint=init_checkpoint, num_microbatches=num_microbatches,
        eval_decode_batches=eval_decode_batches,
        skip_nonfinite_updates=skip_nonfinite_updates, operative_config_extra=chosen)
    if mode == "train" and replicas is not None:
      from models.transformer.trainer import spmd_train_loop  # pylint: disable=g-import-not-at-top
      return spmd_train_loop.run_spmd_train(config, replicas)
    if mode == "train":
      from models.transformer.trainer import train_loop  # pylint: disable=g-import-not-at-top
      return train_loop.run_train(config, mesh_impl)
    checkpoint = _checkpoint_at(model_dir, eval_checkpoint_step)
    if mode in ("eval", "perplexity_eval"):
      from models.transformer.trainer import evaluation  # pylint: disable=g-import-not-at-top
      return evaluation.run_eval(config, mesh_impl, checkpoint, eval_dir_suffix)
    if mode == "decode":
      return decode_io.run_decode(
          checked, mesh_impl, model_dir, checkpoint, vocabulary, batch_size,
          sequence_length, variable_dtype, decode_input_file, decode_output_file)
    from models.transformer.trainer import export  # pylint: disable=g-import-not-at-top
    return export.run_export(
        model_fn, model_dir, _checkpoint_at(model_dir, export_checkpoint_step), vocabulary,
        batch_size, sequence_length, variable_dtype,
        export_path or os.path.join(model_dir, "export"))


def _refuse_unsupported(**given_and_default):
  """MtfError naming the original's run options given a value this trainer ignores."""
  given = sorted(name for name, (value, default) in given_and_default.items()
                 if value is not default and value != default)
  if given:
    raise MtfError("utils.run: %s not supported by this port's trainer; leave %s at "
                   "the default" % (", ".join(given), "it" if len(given) == 1 else "them"))


def _default_binding(selector, name, fallback):
  """The value gin_configs/defaults.gin binds to selector.name (fallback if none)."""
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  path = os.path.join(gin_setup.DEFAULT_GIN_LOCATION, "defaults.gin")
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return fallback
  value = fallback
  for statement in gin.config_parser.ConfigParser(
      text, gin.config.ParserDelegate(skip_unknown=True)):
    if (isinstance(statement, gin.config_parser.BindingStatement)
        and not statement.scope and statement.selector == selector
        and statement.arg_name == name):
      value = statement.value
  return value


def _eval_mode_steps(perplexity_eval_steps, eval_steps):
  """Batches eval mode evaluates: perplexity_eval_steps when the user set it (gin
  always binds defaults.gin's value, so "set" means a value other than that one),
  else eval_steps when set, else perplexity_eval_steps."""
  default = _default_binding("utils.run", "perplexity_eval_steps", 100)
  if eval_steps and perplexity_eval_steps == default:
    return eval_steps
  return perplexity_eval_steps


def _checkpoint_at(model_dir, step):
  """The checkpoint of model_dir at step (None: latest, resolved on restore)."""
  if step is None:
    return None
  return os.path.join(model_dir, "model.ckpt-%d" % int(step))


def _checked_model_fn(model_fn, batch_size, sequence_length, mesh_layout,
                      strict_layout=False):
  """model_fn, checking once (_check_layout) first; its model_record() is the check's."""
  state = {"checked": False, "record": None}

  def check():
    if not state["checked"]:
      state["checked"] = True
      state["record"] = _check_layout(model_fn(), batch_size, sequence_length,
                                      mesh_layout, strict_layout)

  def checked_model_fn():
    check()
    return model_fn()  # a fresh model for the caller's graph

  def model_record():
    check()
    return state["record"]
  checked_model_fn.model_record = model_record
  return checked_model_fn


# Mesh dim names of the shipped layouts (defaults.gin, gin_configs/layouts): a rule naming
# one that this mesh lacks is how one layout serves several meshes. Any other absent
# mesh dim is likely a typo ("batch:bacth", "batch:row" on rows:2,cols:4).
_USUAL_MESH_DIMS = ("all", "batch", "ensemble", "model")


def _check_layout(model, batch_size, sequence_length, mesh_layout, strict_layout=False):
  """Checks the layout's dim names against an eval graph of model, warning (strict_layout:
  LayoutError) about rules naming an unusual absent mesh dim; returns its model_record."""
  import difflib  # pylint: disable=g-import-not-at-top
  from mesh_tf.errors import LayoutError  # pylint: disable=g-import-not-at-top
  from models.transformer import model_graph  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import run_record  # pylint: disable=g-import-not-at-top
  from models.transformer.context import ModeKeys  # pylint: disable=g-import-not-at-top
  graph = model_graph.ModelGraph(model, batch_size, sequence_length, ["inputs", "targets"],
                                 ModeKeys.EVAL, get_variable_dtype())
  unused = model_graph.check_layout_names(graph, mesh_layout)
  mesh_dims = mesh_layout.shape.dimension_names
  suspicious = [(t, m) for t, m in mesh_layout.rules_naming_absent_mesh_dims()
                if mesh_dims and m not in _USUAL_MESH_DIMS]
  for tensor_dim, mesh_dim in suspicious:
    rule = "%s:%s" % (tensor_dim, mesh_dim)
    close = difflib.get_close_matches(mesh_dim, mesh_dims, n=1)
    message = ("layout rule %r names mesh dim %r, which mesh %s lacks (its dims: %s)%s"
               % (rule, mesh_dim, mesh_layout.shape.to_string, ", ".join(mesh_dims),
                  "; did you mean %r?" % close[0] if close else ""))
    if strict_layout:
      raise LayoutError(message, rule=rule, mesh_dim=mesh_dim)
    print("warning: %s; the rule is ignored, so %r is not split (bind "
          "utils.run.strict_layout = True to make this an error)" % (message, tensor_dim),
          flush=True)
  named = {"%s:%s" % r for r in suspicious}
  unused = [rule for rule in unused if rule not in named]
  if unused and mesh_layout.size > 1:
    print("layout rules that split nothing here (ignored): %s"
          % ", ".join(unused), flush=True)
  return run_record.model_record(graph.graph)


@gin.configurable(module="utils")
def tpu_mesh_shape(tpu_topology=gin.REQUIRED, model_parallelism=gin.REQUIRED,
                   ensemble_parallelism=None):
  """The mesh shape the original trainer used on a TPU slice, as an mtf.Shape.

  tpu_topology: a slice name "v2-8" (8 cores), a chip grid "AxB" (2 cores per chip; a
  "_twisted" suffix is ignored) or "AxBxC" (one core each). The cores are split into
  "ensemble", "batch" (what is left) and "model", dims of size 1 left out: ("v2-8", 8)
  -> model:8. A list model_parallelism is a HierarchicalTiling spec.
  """
  topology = str(tpu_topology)
  try:
    if topology.startswith("v"):
      num_cores = int(topology.split("-")[-1])
    else:
      sizes = [int(s) for s in topology.split("_twisted")[0].split("x")]
      if len(sizes) not in (2, 3):
        raise ValueError(topology)
      num_cores = math.prod(sizes) * (2 if len(sizes) == 2 else 1)
  except ValueError:
    num_cores = 0
  if num_cores < 1:
    raise MtfError("tpu_mesh_shape: tpu_topology %r is not of the form vN-CORES, AxB "
                   "or AxBxC" % (tpu_topology,))
  if isinstance(model_parallelism, list):
    return mtf.simd_mesh_impl.HierarchicalTiling.spec_to_mesh_shape(
        model_parallelism, num_cores)
  model_parallelism = int(model_parallelism)
  ensemble = int(ensemble_parallelism or 1)
  if model_parallelism < 1 or num_cores % (model_parallelism * ensemble):
    raise MtfError("tpu_mesh_shape: model_parallelism %d x ensemble_parallelism %d does "
                   "not divide the %d cores of topology %s"
                   % (model_parallelism, ensemble, num_cores, tpu_topology))
  sizes = [("ensemble", ensemble),
           ("batch", num_cores // (model_parallelism * ensemble)),
           ("model", model_parallelism)]
  return mtf.Shape([mtf.Dimension(name, size) for name, size in sizes if size > 1])


# ------------------------------------------------------------------------------------
# Small helpers of the original's utils module; those utils.run does not consult are not
# gin configurables (gin_compat reports a binding of one as skipped).


def inputs_vocabulary(vocabulary):
  """The first of an (inputs, targets) vocabulary tuple, else vocabulary itself."""
  return vocabulary[0] if isinstance(vocabulary, tuple) else vocabulary


def targets_vocabulary(vocabulary):
  """The second of an (inputs, targets) vocabulary tuple, else vocabulary itself."""
  return vocabulary[1] if isinstance(vocabulary, tuple) else vocabulary


def separate_vocabularies(inputs=gin.REQUIRED, targets=gin.REQUIRED):
  """An (inputs, targets) vocabulary pair."""
  if inputs is gin.REQUIRED or targets is gin.REQUIRED:
    raise MtfError("separate_vocabularies: give both the inputs and the targets "
                   "vocabulary")
  return (inputs, targets)


def _metric_accumulator(values, name, default_name, update):
  values = tf.cast(tf.convert_to_tensor(values), tf.float32)
  accum = tf.Variable(0.0, trainable=False, name=name or default_name)
  return accum, update(accum, values)


def metric_max(values, name=None, **kwargs):
  """(max so far, update op): a running maximum of `values` from 0, the original's TF 1
  metric contract; kwargs (e.g. weights) are ignored, as there."""
  del kwargs
  return _metric_accumulator(
      values, name, "metric_max",
      lambda accum, v: accum.assign(tf.maximum(accum, tf.reduce_max(v))))


def metric_sum(values, name=None, **kwargs):
  """(sum so far, update): a running sum of `values`, starting at 0 (see metric_max)."""
  del kwargs
  return _metric_accumulator(
      values, name, "metric_sum", lambda accum, v: accum.assign_add(tf.reduce_sum(v)))


def variable_filter_max_size(v, max_size=1e7):
  """Whether mtf.Variable v has at most max_size elements (a `variable_filter`)."""
  return v.shape.size <= max_size


@gin.configurable(module="utils")
def init_checkpoint_variable_mapping(name, mapping_fn=None):
  """The checkpoint name to restore variable `name` from (mapping_fn(name) if given)."""
  return mapping_fn(name) if mapping_fn else name


@gin.configurable(module="utils")
def should_load_variable(name, filter_fn=None):
  """Whether variable `name` is restored from the init checkpoint (filter_fn(name) if
  given)."""
  return filter_fn(name) if filter_fn else True


@gin.configurable(module="utils")
def serialize_num_microbatches(batch_dim, sequence_length, mesh_shape, layout_rules,
                               tokens_per_microbatch_per_replica=None):
  """Microbatches per step so each replica handles at most about
  tokens_per_microbatch_per_replica tokens at a time (1 when that is None)."""
  if not tokens_per_microbatch_per_replica:
    return 1
  batch_per_replica = mtf.tensor_dim_to_size_per_split(layout_rules, mesh_shape,
                                                       batch_dim)
  lengths = (sequence_length.values() if isinstance(sequence_length, dict)
             else [sequence_length])
  microbatch_size = max(1, tokens_per_microbatch_per_replica // max(lengths))
  while batch_per_replica % microbatch_size:
    microbatch_size -= 1
  return batch_per_replica // microbatch_size


def _checkpoint_steps(model_dir):
  """Steps of the complete "model.ckpt-N" checkpoints in model_dir, ascending."""
  return [step_from_prefix(p) for p in discovery.scan(model_dir, "model.ckpt")]


def _closest_step(target, model_dir):
  steps = _checkpoint_steps(model_dir)
  if not steps:
    raise MtfError("no checkpoint model.ckpt-N in %s" % model_dir, file=model_dir)
  return min(steps, key=lambda s: (abs(s - target), s))


def _all_checkpoints(model_dir, skip_until, stop_after, poll_secs=1.0):
  """Checkpoint paths in step order as they appear (waiting for new ones), from the
  first after skip_until, ending with the first at or after stop_after (or never)."""
  import time  # pylint: disable=g-import-not-at-top
  last = skip_until
  while True:
    new = [s for s in _checkpoint_steps(model_dir) if s > last]
    for step in new:
      yield os.path.join(model_dir, "model.ckpt-%d" % step)
      if stop_after is not None and step >= stop_after:
        return
      last = step
    if not new:
      time.sleep(poll_secs)


def get_checkpoint_iterator(checkpoint_step, model_dir, skip_until=0, stop_after=None,
                            find_closest=True):
  """Checkpoint paths of model_dir to evaluate or decode, as the original chose them.

  checkpoint_step: an int (that step's checkpoint, or the closest one when
  find_closest), a list of ints, None (the latest if after skip_until, as a
  discovery.Latest) or "all" (every checkpoint after skip_until, waiting for new ones
  until one at or after stop_after).
  """
  if checkpoint_step == "all":
    return _all_checkpoints(model_dir, skip_until, stop_after)
  if checkpoint_step is None:
    latest = discovery.latest(model_dir)  # a reader falls back if it is pruned
    if latest is None:
      raise MtfError("no checkpoint model.ckpt-N in %s" % model_dir, file=model_dir)
    return [latest] if step_from_prefix(latest) > skip_until else []
  single = isinstance(checkpoint_step, int)
  wanted = [checkpoint_step] if single else list(checkpoint_step)
  if find_closest:
    wanted = [_closest_step(int(s), model_dir) for s in wanted]
  return [os.path.join(model_dir, "model.ckpt-%d" % int(s)) for s in wanted]


def parse_gin_defaults_and_flags(skip_unknown=False, finalize_config=True):
  """Parses gin as the trainer's command line does (defaults.gin, then the --gin_file,
  --gin_location_prefix and --gin_param flags main.py defines); then locks the config
  unless finalize_config is False."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  flag_values = flags.FLAGS

  def flag(name):
    if name in flag_values and flag_values.is_parsed():
      return list(flag_values[name].value or [])
    return []
  gin_setup.parse_gin(flag("gin_file"), flag("gin_param"),
                      flag("gin_location_prefix") or None, skip_unknown=skip_unknown)
  if finalize_config:
    gin.finalize()



def _dynamic_text2self(mtf_features):
  """Rewrites a text2text feature dict (mtf Tensors) as text2self, for "delimited_lm".

  Each example's (or packed segment's) input tokens are followed by its target tokens in
  a "targets" twice as long (length dim "length"). Packed features also give
  "targets_segmentation" and "targets_position" (positions continuing after the inputs).
  """
  inputs = mtf_features["inputs"]
  targets = mtf_features["targets"]
  mesh = targets.mesh
  in_len_dim = inputs.shape.dims[-1]
  tg_len_dim = targets.shape.dims[-1]
  packed = "inputs_segmentation" in mtf_features

  def segmentation_and_position(name, tokens, length_dim):
    if packed:
      return (mtf_features[name + "_segmentation"], mtf_features[name + "_position"])
    # One segment per example: its non-padding tokens, at their own indices.
    return (mtf.to_int32(mtf.not_equal(tokens, 0)),
            mtf.broadcast(mtf.range(mesh, length_dim, tf.int32), tokens.shape))

  in_seg, in_pos = segmentation_and_position("inputs", inputs, in_len_dim)
  tg_seg, tg_pos = segmentation_and_position("targets", targets, tg_len_dim)

  # Segment ids are smaller than the targets length (each segment holds a target token).
  seg_dim = mtf.Dimension("segments", tg_len_dim.size)
  in_onehot = mtf.one_hot(in_seg, seg_dim, dtype=tf.int32)
  tg_onehot = mtf.one_hot(tg_seg, seg_dim, dtype=tf.int32)
  is_real = mtf.to_int32(mtf.not_equal(mtf.range(mesh, seg_dim, tf.int32), 0))
  in_count = mtf.reduce_sum(in_onehot, reduced_dim=in_len_dim) * is_real
  tg_count = mtf.reduce_sum(tg_onehot, reduced_dim=tg_len_dim) * is_real
  out_dim = mtf.Dimension("new_length", in_len_dim.size + tg_len_dim.size)
  # Where each segment starts in the output; padding (segment 0) starts past the end,
  # so its tokens land nowhere.
  start = (mtf.cumsum(in_count + tg_count, seg_dim, exclusive=True)
           + out_dim.size * (1 - is_real))

  def per_token(onehot, per_segment, like):
    return mtf.einsum([onehot, per_segment], output_shape=like.shape)

  in_dest = in_pos + per_token(in_onehot, start, in_pos)
  tg_new_pos = tg_pos + per_token(tg_onehot, in_count, tg_pos)
  tg_dest = tg_new_pos + per_token(tg_onehot, start, tg_pos)
  out_range = mtf.range(mesh, out_dim, tf.int32)
  in_move = mtf.to_int32(mtf.equal(out_range, in_dest))
  tg_move = mtf.to_int32(mtf.equal(out_range, tg_dest))
  out_shape = mtf.Shape(inputs.shape.dims[:-1] + [out_dim])

  def merge(from_inputs, from_targets):
    moved = (mtf.einsum([from_inputs, in_move], output_shape=out_shape)
             + mtf.einsum([from_targets, tg_move], output_shape=out_shape))
    return mtf.rename_dimension(moved, "new_length", "length")

  result = {"targets": merge(inputs, targets)}
  if packed:
    result["targets_segmentation"] = merge(in_seg, tg_seg)
    result["targets_position"] = merge(in_pos, tg_new_pos)
  return result


def _maybe_add_pretokenized_features(examples, vocabulary):
  """examples (dicts of token ids, changed in place), each missing
  "<inputs|targets>_pretokenized" made by decoding the feature's ids with its
  vocabulary (a Vocabulary or an (inputs, targets) pair)."""
  vocabs = {"inputs": inputs_vocabulary(vocabulary),
            "targets": targets_vocabulary(vocabulary)}
  warned = set()
  for example in examples:
    for feature, vocab in vocabs.items():
      key = feature + "_pretokenized"
      if feature not in example or key in example:
        continue
      ids = example[feature]
      ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
      example[key] = vocab.decode(ids)
      if feature not in warned:
        warned.add(feature)
        tf.get_logger().warning(
            "Feature %r is approximated by decoding the token ids of %r.", key, feature)
  return examples
