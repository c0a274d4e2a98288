"""Checks of scores and decodes against the model's own logits, computed here apart
from the estimator's scoring and decoding: the logits of a teacher-forced pass on one
device, with the log-softmax and the argmax taken in numpy."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import model_graph
from models.transformer.context import ModeKeys


class LogitsRunner:
  """The logits of teacher-forced (eval mode) passes of estimator's model, restored
  from checkpoint_path (default: the latest), on one device; built once, run often."""

  def __init__(self, estimator, feature_keys, checkpoint_path=None):
    mesh_impl = mtf.PlacementMeshImpl("", "", [""])
    graph = model_graph.ModelGraph(estimator.model_fn(), estimator.batch_size,
                                   estimator.sequence_length, sorted(feature_keys),
                                   ModeKeys.EVAL, estimator.variable_dtype)
    graph.lowering(mesh_impl)
    mtf.restore_checkpoint(checkpoint_path or estimator.model_dir, mesh_impl)
    self.batch_size = estimator.batch_size
    self._run = tf.function(lambda f: graph.lowering(mesh_impl, f).export_to_tf_tensor(
        mtf.cast(graph.logits, tf.float32)))

  def __call__(self, features):
    """float64 [n, length, vocab] for int arrays [n, length] (any n)."""
    features = {k: np.asarray(v) for k, v in features.items()}
    n = len(features["targets"])
    pad = -n % self.batch_size
    features = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)])
                for k, v in features.items()}
    out = []
    for start in range(0, n + pad, self.batch_size):
      out.append(self._run({k: tf.constant(v[start:start + self.batch_size], tf.int32)
                            for k, v in features.items()}).numpy().astype(np.float64))
    return np.concatenate(out)[:n]


def model_logits(estimator, features, checkpoint_path=None):
  """float64 [n, length, vocab]: LogitsRunner's logits of features (int arrays)."""
  return LogitsRunner(estimator, features, checkpoint_path)(features)


def greedy_lm_decode(estimator, prompts, length, vocab_size, eos_id=1):
  """int32 [n, length]: an LM's greedy continuations of prompts (id lists) computed
  here position by position from teacher-forced logits (argmax over the vocab_size
  real ids), as decoding returns them: 0 at the prompt positions and after EOS."""
  runner = LogitsRunner(estimator, ["targets"])
  rows = np.zeros([len(prompts), length], np.int32)
  for n, prompt in enumerate(prompts):
    rows[n, :len(prompt)] = prompt
  done = np.zeros(len(prompts), bool)
  for p in range(min(len(prompt) for prompt in prompts), length):
    best = runner({"targets": rows})[:, p, :vocab_size].argmax(-1)
    for n, prompt in enumerate(prompts):
      if p >= len(prompt) and not done[n]:
        rows[n, p] = best[n]
        done[n] = best[n] == eos_id
  for n, prompt in enumerate(prompts):
    rows[n, :len(prompt)] = 0
  return rows


def log_softmax(logits):
  top = logits.max(-1, keepdims=True)
  return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def teacher_forced_log_probs(estimator, features, weights, checkpoint_path=None):
  """Per row, the sum over weights (0/1 [n, length]) of log p(target token)."""
  log_probs = log_softmax(model_logits(estimator, features, checkpoint_path))
  targets = np.asarray(features["targets"])
  picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
  return (picked * np.asarray(weights)).sum(-1)


def assert_greedy_lm_continuations(estimator, prompts, decoded, vocab_size, atol=1e-4):
  """Each decoded row (an LM's greedy continuation: 0 where its prompt was, then the
  new ids up to and with EOS) picks, at every new position, a token of maximal logit
  among the vocab_size real ids (decoding never picks the ids that pad the model's
  vocab dim) given the prompt and the ids before it. prompts: id lists; decoded:
  [n, length]."""
  length = np.asarray(decoded).shape[1]
  rows = np.zeros([len(prompts), length], np.int32)
  ends = []
  for n, (prompt, out) in enumerate(zip(prompts, np.asarray(decoded))):
    out = list(out)
    assert not any(out[:len(prompt)]), "the prompt positions are not zero: %s" % out
    rows[n, :len(prompt)] = prompt
    rows[n, len(prompt):] = out[len(prompt):]
    eos = [p for p in range(len(prompt), length) if out[p] == 1]
    ends.append(eos[0] + 1 if eos else length)
    assert not any(out[ends[-1]:]), "ids after EOS: %s" % out
  pad = -len(rows) % estimator.batch_size
  padded = np.concatenate([rows, np.zeros([pad, length], np.int32)])
  logits = model_logits(estimator, {"targets": padded})[..., :vocab_size]
  for n, prompt in enumerate(prompts):
    for p in range(len(prompt), ends[n]):
      best = logits[n, p].max()
      assert logits[n, p, rows[n, p]] >= best - atol, (
          "row %d position %d: decoded id %d has logit %g, the best %d has %g"
          % (n, p, rows[n, p], logits[n, p, rows[n, p]], logits[n, p].argmax(), best))


def assert_greedy_decodes(estimator, inputs, decoded, vocab_size, atol=1e-4):
  """An encoder-decoder's greedy decodes ([n, length], zero after EOS) of inputs
  ([n, length] ids, n a multiple of the batch size) pick, at every position up to
  and with EOS, a token of maximal logit among the vocab_size real ids given the
  inputs and the ids before it."""
  decoded = np.asarray(decoded)
  logits = model_logits(estimator, {"inputs": np.asarray(inputs),
                                    "targets": decoded})[..., :vocab_size]
  for n, row in enumerate(decoded):
    eos = np.flatnonzero(row == 1)
    end = eos[0] + 1 if eos.size else len(row)
    assert not row[end:].any(), "ids after EOS: %s" % row
    for p in range(end):
      best = logits[n, p].max()
      assert logits[n, p, row[p]] >= best - atol, (
          "row %d position %d: decoded id %d has logit %g, the best %d has %g"
          % (n, p, row[p], logits[n, p, row[p]], logits[n, p].argmax(), best))
