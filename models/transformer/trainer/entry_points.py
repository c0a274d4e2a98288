"""The original's Transformer entry points (`utils.train_model`, `eval_model`,
`infer_model`, decoding, scoring, export), with its parameters, on the TF 2 trainer.

Where the original takes an `estimator`, these take the `MeshEstimator` of
`utils.get_estimator`. An `input_fn(params)` returns a tf.data.Dataset of int32 feature
dicts batched to the estimator's batch size, as the original's did.
"""
import functools
import os

import gin
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import MtfError
from mesh_tf.shapes import MeshLayout
from models.transformer.trainer import decode_io
from models.transformer.trainer import evaluation
from models.transformer import model_graph
from models.transformer.trainer import run_setup


def _vocab(vocabulary, key):
  """The inputs or targets vocabulary of a vocabulary or an (inputs, targets) pair."""
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  pick = utils.inputs_vocabulary if key == "inputs" else utils.targets_vocabulary
  return pick(tuple(vocabulary) if isinstance(vocabulary, list) else vocabulary)


def _rows(id_lists, length, batch_size):
  """int32 [n rounded up to whole batches, length]: each list zero-padded or trimmed;
  the extra rows repeat the first (their results are dropped)."""
  rows = [list(ids)[:length] for ids in id_lists]
  rows += [rows[0] if rows else []] * (-len(rows) % batch_size)
  out = np.zeros([len(rows), length], np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def _input_fn(features, batch_size):
  """input_fn(params) over a dict of int32 [n, length] arrays, in batches."""
  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensor_slices(features).batch(batch_size)
  return input_fn


@gin.configurable(module="utils")
def get_estimator(model_type, vocabulary, mesh_shape, layout_rules, model_dir, batch_size,
                  sequence_length, autostack, learning_rate_schedule, keep_checkpoint_max,
                  save_checkpoints_steps, optimizer, predict_fn, variable_filter,
                  ensemble_inputs, use_tpu, tpu_job_name, iterations_per_loop, cluster,
                  init_checkpoint=None, mesh_devices=None, score_in_predict_mode=False):
  """The MeshEstimator the other entry points take (the original's TPUEstimator).

  batch_size is the global number of sequences per batch. autostack, tpu_job_name and
  cluster are accepted and unused (TF 2 needs none of them); use_tpu, predict_fn,
  variable_filter and ensemble_inputs are not supported and must be off.
  """
  from models.transformer.trainer import estimator as estimator_lib  # pylint: disable=g-import-not-at-top
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  del autostack, tpu_job_name, cluster
  unsupported = {"use_tpu": use_tpu, "predict_fn": predict_fn,
                 "variable_filter": variable_filter, "ensemble_inputs": ensemble_inputs}
  given = [name for name, value in unsupported.items() if value]
  if given:
    raise MtfError("get_estimator: %s not supported by this port (for TPUs, see the "
                   "README's SIMD on TPU set-up)" % ", ".join(given))
  mesh_impl = run_setup.make_mesh_impl(MeshLayout(mesh_shape, layout_rules),
                                       mesh_devices or None)
  size = utils.decode_io.vocab_size
  model_fn = functools.partial(
      utils.build_model, model_type=model_type,
      input_vocab_size=size(_vocab(vocabulary, "inputs")),
      output_vocab_size=size(_vocab(vocabulary, "targets")),
      layout_rules=mesh_impl.mesh_layout)  # the backend's MeshLayout itself
  return estimator_lib.MeshEstimator(
      model_fn, mesh_impl, model_dir, int(batch_size), sequence_length,
      utils.get_variable_dtype(), optimizer=optimizer,
      learning_rate_schedule=learning_rate_schedule,
      keep_checkpoint_max=keep_checkpoint_max,
      save_checkpoints_steps=save_checkpoints_steps,
      iterations_per_loop=iterations_per_loop, init_checkpoint=init_checkpoint,
      score_in_predict_mode=score_in_predict_mode)


def encode_inputs(inputs, vocabulary, model_type, batch_size, sequence_length, eos_id=1,
                  unscored_prefix=None):
  """int32 [n', length] ids of the input strings (n' rounded up to whole batches), each
  after unscored_prefix (if given); encoder-decoder inputs end with eos_id, LM prompts
  do not (the model continues them)."""
  vocab = _vocab(vocabulary, "inputs")
  key = "inputs" if isinstance(sequence_length, dict) and "inputs" in sequence_length \
      else "targets"
  prefix = list(vocab.encode(unscored_prefix)) if unscored_prefix else []
  eos = [] if model_type == "lm" else [eos_id]
  rows = [prefix + list(vocab.encode(text.strip())) + eos for text in inputs]
  return _rows(rows, model_graph.feature_length(sequence_length, key), batch_size)


def encode_delimited_lm(inputs, targets, vocabulary, batch_size, sequence_length,
                        eos_id=1, include_final_eos=True):
  """(ids, weights), int32 [n', length]: for an LM, each input, eos_id, then its target
  (and a final eos_id); weights are 1 on the target positions (what is scored)."""
  vocab = _vocab(vocabulary, "targets")
  rows, masks = [], []
  for prefix, target in zip(inputs, targets):
    head = list(vocab.encode(prefix)) + [eos_id]
    tail = list(vocab.encode(target)) + ([eos_id] if include_final_eos else [])
    rows.append(head + tail)
    masks.append([0] * len(head) + [1] * len(tail))
  length = model_graph.feature_length(sequence_length, "targets")
  return _rows(rows, length, batch_size), _rows(masks, length, batch_size)


def _checkpoints(checkpoint_step, model_dir):
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  return utils.get_checkpoint_iterator(checkpoint_step, model_dir)


def train_model(estimator, vocabulary, sequence_length, batch_size, train_dataset_fn,
                train_steps, ensemble_inputs, dataset_split="train", skip_seen_data=False,
                seen_data_init_step=0, checkpoint_input_pipeline=False):
  """Trains estimator's model on train_dataset_fn's data until global step train_steps.
  With skip_seen_data, a resumed run skips the batches the steps since
  seen_data_init_step consumed. ensemble_inputs and checkpoint_input_pipeline must be off.
  """
  if ensemble_inputs or checkpoint_input_pipeline:
    raise MtfError("train_model: ensemble_inputs and checkpoint_input_pipeline are not "
                   "supported by this port")
  dataset = run_setup.batched_dataset(train_dataset_fn, sequence_length, vocabulary,
                                      dataset_split, batch_size)
  latest = estimator.latest_checkpoint()
  if skip_seen_data and latest:
    seen = mtf.checkpoint.step_from_prefix(latest) - seen_data_init_step
    dataset = dataset.skip(max(seen, 0))
  return estimator.train(dataset, train_steps)


def decode(estimator, input_fn, vocabulary, checkpoint_path=None):
  """Decoded strings of every example input_fn yields (cut at EOS)."""
  vocab = _vocab(vocabulary, "targets")
  return [decode_io.ids_to_text(row["outputs"], vocab) for row in
          estimator.predict(input_fn, checkpoint_path=checkpoint_path)]


@gin.configurable(module="utils")
def decode_from_file(estimator, vocabulary, model_type, batch_size, sequence_length,
                     checkpoint_path=None, input_filename=gin.REQUIRED,
                     output_filename=gin.REQUIRED, eos_id=1, repeats=1):
  """Decodes each line of input_filename (repeats times) and writes one line per
  decode to output_filename-<step> (the checkpoint's step); returns the decodes."""
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  inputs = [line for line in utils.get_inputs_from_file(input_filename)
            for _ in range(repeats)]
  ids = encode_inputs(inputs, vocabulary, model_type, batch_size, sequence_length,
                      eos_id=eos_id)
  checkpoint_path = checkpoint_path or estimator.latest_checkpoint()
  decodes = decode(estimator, _input_fn({"inputs": ids}, batch_size), vocabulary,
                   checkpoint_path=checkpoint_path)[:len(inputs)]
  step = mtf.checkpoint.step_from_prefix(checkpoint_path or "")
  utils.write_lines_to_file([" ".join(d.splitlines()) for d in decodes],  # one line each
                            "%s-%d" % (output_filename, step or 0))
  return decodes


def _eval_datasets(dataset_fn, sequence_length, vocabulary, dataset_split, caller):
  """(eval_datasets, is_list): dataset_fn(sequence_length, vocabulary, dataset_split)'s
  list of EvalDatasets (is_list True), or its one tf.data.Dataset as an EvalDataset
  named "dataset" (is_list False)."""
  from models.transformer import dataset as dataset_lib  # pylint: disable=g-import-not-at-top
  if dataset_fn is None:
    raise MtfError("%s: no dataset function given" % caller)
  data = dataset_fn(sequence_length=sequence_length, vocabulary=vocabulary,
                    dataset_split=dataset_split)
  if isinstance(data, tf.data.Dataset):
    return [dataset_lib.EvalDataset("dataset", lambda: data, None, [])], False
  items = list(data)
  for item in items:
    if not _is_eval_dataset(item):
      raise MtfError("%s: the dataset function returned %r: expected a tf.data.Dataset "
                     "or a list of EvalDatasets" % (caller, item))
  if not items:
    raise MtfError("%s: the dataset function returned no datasets for split %r"
                   % (caller, dataset_split))
  return items, True


def _combined_input_fn(eval_datasets, sequence_length, batch_size):
  """input_fn(params) over the examples of all eval_datasets, one after another, with
  only the model's int32 features (padded or trimmed to their lengths); the last batch
  is filled up with all-zero examples (whose results the callers drop)."""
  def fill(batch):
    out = {}
    for key, value in batch.items():
      out[key] = tf.pad(value, [[0, batch_size - tf.shape(value)[0]], [0, 0]])
      out[key].set_shape([batch_size, value.shape[1]])
    return out

  def input_fn(params):
    del params
    combined = None
    for item in eval_datasets:  # example_stream calls the lambda at once
      examples = run_setup.example_stream(lambda **unused: item.dataset_fn(),
                                          sequence_length, None, None, repeat=False)
      combined = examples if combined is None else combined.concatenate(examples)
    return combined.batch(batch_size).map(fill)
  return input_fn


def _example_text(example, key, vocabulary):
  """The text of an example's feature: its "<key>_pretokenized" string if it has one,
  else its ids decoded."""
  text = example.get(key + "_pretokenized")
  if text is None:
    return decode_io.ids_to_text(example[key], _vocab(vocabulary, key))
  return text.decode("utf-8") if isinstance(text, bytes) else str(text)


@gin.configurable(module="utils")
def decode_from_dataset(estimator, vocabulary, model_type, batch_size, sequence_length,
                        checkpoint_path=None, infer_dataset_fn=gin.REQUIRED,
                        dataset_split="validation", decode_output_dir=gin.REQUIRED):
  """Decodes the "inputs" of infer_dataset_fn's examples; returns the decodes. For each
  EvalDataset (as T5's mesh_inference_dataset_fn returns), writes <name>_<step>_predictions,
  <name>_targets (postprocessed) and <name>_inputs to decode_output_dir; for one
  tf.data.Dataset, decodes-<step>, inputs-<step> and targets-<step>."""
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  del model_type
  data, is_list = _eval_datasets(infer_dataset_fn, sequence_length, vocabulary,
                                 dataset_split, "decode_from_dataset")
  checkpoint_path = checkpoint_path or estimator.latest_checkpoint()
  step = mtf.checkpoint.step_from_prefix(checkpoint_path or "") or 0
  all_decodes = decode(estimator, _combined_input_fn(data, sequence_length, batch_size),
                       vocabulary, checkpoint_path=checkpoint_path)
  start = 0
  for item in data:
    examples = list(item.dataset_fn().as_numpy_iterator())
    decodes = all_decodes[start:start + len(examples)]
    start += len(examples)
    inputs = [_example_text(e, "inputs", vocabulary) if "inputs" in e else ""
              for e in examples]
    targets = [_example_text(e, "targets", vocabulary) if "targets" in e else ""
               for e in examples]
    if item.postprocess_fn:
      targets = [item.postprocess_fn(t) for t in targets]
    if is_list:
      names = ("%s_%d_predictions" % (item.name, step), "%s_inputs" % item.name,
               "%s_targets" % item.name)
    else:
      names = ("decodes-%d" % step, "inputs-%d" % step, "targets-%d" % step)
    for name, lines in zip(names, (decodes, inputs, targets)):
      utils.write_lines_to_file([" ".join(str(x).splitlines()) for x in lines],
                                "%s/%s" % (decode_output_dir, name))
  return all_decodes[:start]


@gin.configurable(module="utils")
def infer_model(estimator, vocabulary, sequence_length, batch_size, model_type, model_dir,
                eval_checkpoint_step, checkpoint_paths=None, decode_fn=decode_from_file):
  """Runs decode_fn for each checkpoint (default: get_checkpoint_iterator's)."""
  paths = checkpoint_paths or _checkpoints(eval_checkpoint_step, model_dir)
  return [decode_fn(estimator, vocabulary, model_type, batch_size, sequence_length,
                    checkpoint_path=path) for path in paths]


def compute_log_likelihoods(estimator, input_fn, checkpoint_path=None):
  """The list of per-example log-likelihoods (floats) of input_fn's targets."""
  return [row["scores"] for row in estimator.score(input_fn, checkpoint_path)]


def _texts(results, key, vocabulary):
  return [_example_text(r, key, vocabulary) for r in results]


def _unpadded_length(ids):
  """The position of the first padding id (0) in ids, or their length if none."""
  pads = np.flatnonzero(np.asarray(ids) == 0)
  return int(pads[0]) if pads.size else len(ids)


@gin.configurable(module="utils")
def save_scores(results, vocabulary, scores_filename=None, save_example_text=True):
  """The list of scores of results (the estimator's scoring rows), or with
  save_example_text (scores, inputs, targets) (no inputs: (scores, targets)). With a
  scores_filename, writes <scores_filename>.scores and, with save_example_text,
  .targets, .lengths (each target's ids before its first padding) and .inputs."""
  from models.transformer import utils  # pylint: disable=g-import-not-at-top
  if not results:
    raise ValueError("No examples were scored.")
  scores = [float(r["scores"]) for r in results]
  if scores_filename is not None:
    utils.write_lines_to_file(["%.9g" % s for s in scores], scores_filename + ".scores")
  if not save_example_text:
    return scores
  targets = _texts(results, "targets", vocabulary)
  lengths = [_unpadded_length(r["targets"]) for r in results]
  inputs = _texts(results, "inputs", vocabulary) if "inputs" in results[0] else None
  if scores_filename is not None:
    utils.write_lines_to_file(targets, scores_filename + ".targets")
    utils.write_lines_to_file(lengths, scores_filename + ".lengths")
    if inputs is not None:
      utils.write_lines_to_file(inputs, scores_filename + ".inputs")
  return (scores, targets) if inputs is None else (scores, inputs, targets)


@gin.configurable(module="utils")
def save_scores_to_tfrecords(results, vocabulary, scores_filename, shard_idx=0,
                             save_ids_only=False):
  """Writes results to <scores_filename>_<shard_idx>.tfrecord (returned) as
  tf.train.Examples of "input", "target" (bytes) and "score" (float). With
  save_ids_only, "input" keeps only the text before the first space (an example id)."""
  path = "%s_%d.tfrecord" % (scores_filename, shard_idx)
  directory = os.path.dirname(path)
  if directory:
    tf.io.gfile.makedirs(directory)
  targets = _texts(results, "targets", vocabulary)
  inputs = [_example_text(r, "inputs", vocabulary) if "inputs" in r else ""
            for r in results]
  if save_ids_only:
    inputs = [text.split(" ", 1)[0] for text in inputs]
  with tf.io.TFRecordWriter(path) as writer:
    for result, input_text, target_text in zip(results, inputs, targets):
      feature = {
          "input": tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[input_text.encode("utf-8")])),
          "target": tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[target_text.encode("utf-8")])),
          "score": tf.train.Feature(float_list=tf.train.FloatList(
              value=[float(result.get("scores", 0.0))]))}
      writer.write(tf.train.Example(features=tf.train.Features(
          feature=feature)).SerializeToString())
  return path


@gin.configurable(module="utils")
def score_with_estimator(estimator, input_fn, eval_checkpoint_step, model_dir, vocabulary,
                         score_postprocess_fn=save_scores, num_examples=None):
  """Scores input_fn's examples with the eval_checkpoint_step checkpoint; returns
  score_postprocess_fn(results, vocabulary). num_examples None drops the trailing
  results whose targets are all padding (the rows that fill the last batch)."""
  path = _checkpoints(eval_checkpoint_step, model_dir)[0]
  results = list(estimator.score(input_fn, path))
  if num_examples is None:
    while results and not np.any(results[-1]["targets"]):
      results.pop()
  else:
    results = results[:num_examples]
  return score_postprocess_fn(results, vocabulary)


@gin.configurable(module="utils")
def score_with_estimator_lazy(estimator, input_fn, eval_checkpoint_step, model_dir,
                              vocabulary, score_postprocess_fn=save_scores_to_tfrecords,
                              num_examples=None, num_examples_per_shard=100000):
  """Like score_with_estimator, streaming: calls score_postprocess_fn(results,
  vocabulary, shard_idx=i) for every num_examples_per_shard results."""
  path = _checkpoints(eval_checkpoint_step, model_dir)[0]
  shard, index, outputs = [], 0, []
  for count, row in enumerate(estimator.score(input_fn, path)):
    if num_examples is not None and count >= num_examples:
      break
    shard.append(row)
    if len(shard) == num_examples_per_shard:
      outputs.append(score_postprocess_fn(shard, vocabulary, shard_idx=index))
      shard, index = [], index + 1
  if shard:
    outputs.append(score_postprocess_fn(shard, vocabulary, shard_idx=index))
  return outputs


def _is_eval_dataset(item):
  return hasattr(item, "dataset_fn") and hasattr(item, "metric_fns")


@gin.configurable(module="utils")
def eval_model(estimator, vocabulary, sequence_length, batch_size, dataset_split,
               model_dir, eval_dataset_fn, eval_summary_dir, eval_checkpoint_step,
               eval_with_score=False, output_eval_examples=True, eval_dir_suffix=None,
               score_with_estimator_fn=score_with_estimator):
  """Evaluates the checkpoints get_checkpoint_iterator(eval_checkpoint_step) names;
  returns {checkpoint_path: results}. eval_dataset_fn returns a dataset (loss,
  perplexity and token accuracy are written under model_dir/eval[_suffix]) or, as in
  the original, a list of EvalDatasets, whose decodes each metric_fn scores."""
  del eval_summary_dir, score_with_estimator_fn
  if eval_with_score:
    raise MtfError("eval_model: eval_with_score is not supported; use "
                   "score_from_dataset")
  data = eval_dataset_fn(sequence_length=sequence_length, vocabulary=vocabulary,
                         dataset_split=dataset_split)
  results = {}
  for path in _checkpoints(eval_checkpoint_step, model_dir):
    if isinstance(data, tf.data.Dataset):
      dataset = run_setup.batched_dataset(lambda **unused: data, sequence_length,
                                          vocabulary, dataset_split, batch_size,
                                          repeat=False)
      result = estimator.evaluate(dataset, steps=10 ** 9, checkpoint_path=path)
      evaluation.write_eval_results(model_dir, result["step"], result, eval_dir_suffix)
    else:
      result = {}
      for item in data:
        if not _is_eval_dataset(item):
          raise MtfError("eval_dataset_fn returned %r: expected a tf.data.Dataset or a "
                         "list of EvalDatasets" % (item,))
        result[item.name] = _eval_decodes(estimator, item, vocabulary, sequence_length,
                                          batch_size, path, output_eval_examples)
    print("eval %s: %s" % (path, result), flush=True)
    results[path] = result
  return results


def _eval_decodes(estimator, eval_dataset, vocabulary, sequence_length, batch_size, path,
                  output_eval_examples):
  examples = list(eval_dataset.dataset_fn().as_numpy_iterator())
  def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)
  inputs = [text(e.get("inputs_pretokenized", e.get("inputs", b""))) for e in examples]
  targets = [text(e.get("targets_pretokenized", e.get("targets", b""))) for e in examples]
  ids = encode_inputs(inputs, vocabulary, "bitransformer", batch_size, sequence_length)
  predictions = decode(estimator, _input_fn({"inputs": ids}, batch_size), vocabulary,
                       checkpoint_path=path)[:len(inputs)]
  if eval_dataset.postprocess_fn:
    predictions = [eval_dataset.postprocess_fn(p) for p in predictions]
    targets = [eval_dataset.postprocess_fn(t) for t in targets]
  if output_eval_examples:
    for i in range(min(3, len(inputs))):
      print("%r -> %r (target %r)" % (inputs[i], predictions[i], targets[i]), flush=True)
  scores = {}
  for metric_fn in eval_dataset.metric_fns:
    scores.update(metric_fn(targets, predictions))
  return scores


@gin.configurable(module="utils")
def score_from_strings(estimator, vocabulary, model_type, batch_size, sequence_length,
                       model_dir, eval_checkpoint_step, inputs=gin.REQUIRED,
                       targets=gin.REQUIRED, score_postprocess_fn=gin.REQUIRED, eos_id=1,
                       score_eos=True, score_with_estimator_fn=score_with_estimator):
  """Log-likelihoods of each target string given its input string (an LM scores the
  target after "input EOS"); score_eos counts the final EOS in the score."""
  if model_type == "lm":
    ids, weights = encode_delimited_lm(inputs, targets, vocabulary, batch_size,
                                       sequence_length, eos_id, include_final_eos=score_eos)
    features = {"targets": ids, "weights": weights}
  else:
    vocab = _vocab(vocabulary, "targets")
    target_ids = [list(vocab.encode(t)) + ([eos_id] if score_eos else [])
                  for t in targets]
    features = {
        "inputs": encode_inputs(inputs, vocabulary, model_type, batch_size,
                                sequence_length, eos_id),
        "targets": _rows(target_ids, model_graph.feature_length(sequence_length, "targets"),
                         batch_size)}
  return score_with_estimator_fn(
      estimator, _input_fn(features, batch_size), eval_checkpoint_step, model_dir,
      vocabulary, score_postprocess_fn, num_examples=len(targets))


@gin.configurable(module="utils")
def score_from_dataset(estimator, vocabulary, batch_size, sequence_length, model_dir,
                       eval_checkpoint_step, dataset_split, score_dataset_fn=None,
                       score_postprocess_fn=gin.REQUIRED,
                       score_with_estimator_fn=score_with_estimator):
  """Log-likelihoods of the targets of score_dataset_fn's examples (a list of
  EvalDatasets, as T5's MtfModel.score passes, or one tf.data.Dataset), as
  score_with_estimator_fn returns them. Only the model's features are read."""
  data, _ = _eval_datasets(score_dataset_fn, sequence_length, vocabulary,
                           dataset_split, "score_from_dataset")
  return score_with_estimator_fn(
      estimator, _combined_input_fn(data, sequence_length, batch_size),
      eval_checkpoint_step, model_dir, vocabulary, score_postprocess_fn)


def export_model(estimator, export_dir, vocabulary, sequence_length, model_type,
                 eval_with_score=False, batch_size=1, checkpoint_path=None):
  """Writes a SavedModel decoding ids and text to export_dir; returns its path."""
  del sequence_length, model_type
  if eval_with_score:
    raise MtfError("export_model: eval_with_score is not supported; the export decodes")
  return estimator.export(export_dir, vocabulary, checkpoint_path=checkpoint_path,
                          batch_size=batch_size)


@gin.configurable(module="utils")
def flexible_ckpt_init_mapping(ckpt_path="", new_layers=None, return_mapping_fn=True):
  """A name -> checkpoint key function (or, if not return_mapping_fn, its dict over
  ckpt_path's keys) for a model with layers inserted: new_layers (indices) map to None
  (not loaded); later layer_NNN variables map to the index they had before."""
  import re  # pylint: disable=g-import-not-at-top
  new = sorted(set(new_layers or []))

  def mapping_fn(name):
    match = re.search(r"layer_(\d{3})", name)
    if not match:
      return name
    index = int(match.group(1))
    if index in new:
      return None
    old = index - sum(1 for n in new if n < index)
    return name[:match.start(1)] + "%03d" % old + name[match.end(1):]
  if return_mapping_fn:
    return mapping_fn
  names = [n for n, _ in tf.train.list_variables(ckpt_path)] if ckpt_path else []
  return {n: mapping_fn(n) for n in names}
