"""Decoding loops over a logits function: beam search and greedy / temperature sampling.

Both loops are `mtf.while_loop`s, so they lower on every backend. The caller supplies

    logits_fn(step_num, ids, states) -> (logits, new_states)

where step_num is a scalar int32 Tensor, the position being decoded; ids holds the
sequences so far (dims of initial_ids); logits has the dims of ids minus the length dim,
plus one vocabulary dim, and scores the token at position step_num.

initial_ids is int32 [batch..., (beam,) length]: nonzero ids are kept as given (a prompt),
zeros are decoded, left to right from the first zero. A sequence stops at the first EOS
it generates; later positions stay 0.
"""
import gin
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Tensor
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import reduce as reduce_ops
from mesh_tf.ops.creation import constant, fill
from mesh_tf.ops.indexing import gather, mtf_range, one_hot
from mesh_tf.ops.reshape import rename_dimension, reshape, transpose
from mesh_tf.ops.sampling import sample_with_temperature
from mesh_tf.ops.slicewise import slicewise
from mesh_tf.ops.slicing import concat
from mesh_tf.ops.sorting import top_k
from mesh_tf.ops.control_flow import while_loop
from mesh_tf.shapes import Dimension, Shape

EOS_ID = 1
INF = 1e7

# Names of the candidate dims beam search builds; they must not clash with user dims.
_DOUBLE_BEAM = "double_beam"
_BEAM_AND_VOCAB = "beam_and_vocab"
_PREFILTER = "prefilter"
_CANDIDATES = "finished_candidates"


def _check_ids(initial_ids, min_ndims, fn_name):
  if initial_ids.dtype != tf.int32:
    raise ShapeError("%s: initial_ids %s must be int32, not %s" % (
        fn_name, initial_ids.name, initial_ids.dtype.name), tensor=initial_ids.name)
  if initial_ids.shape.ndims < min_ndims:
    raise ShapeError("%s: initial_ids %s %s needs at least %d dims (%s)" % (
        fn_name, initial_ids.name, initial_ids.shape, min_ndims,
        "[batch..., beam, length]" if min_ndims == 2 else "[..., length]"),
                     tensor=initial_ids.name)


def _vocab_dim(logits, ids_dims, fn_name):
  """The one dim of logits that is not a dim of the ids (minus length)."""
  extra = [d for d in logits.shape.dims if d not in ids_dims]
  missing = [d for d in ids_dims if d not in logits.shape.dims]
  if len(extra) != 1 or missing:
    raise ShapeError(
        "%s: logits_fn returned logits %s %s; it must have the dims %s plus exactly one "
        "vocabulary dim" % (fn_name, logits.name, logits.shape, Shape(ids_dims)),
        tensor=logits.name)
  return extra[0]


def _decode_start(initial_ids, length_dim):
  """Scalar int32: the first position holding a 0 in any sequence (length if none)."""
  positions = mtf_range(initial_ids.mesh, length_dim, tf.int32)
  first_zero = ew.where(ew.equal(initial_ids, 0), positions, length_dim.size,
                        output_shape=initial_ids.shape)
  return reduce_ops.reduce_min(first_zero, output_shape=Shape([]))


def _write_at(ids, position, new_ids, length_dim):
  """ids with new_ids (ids' dims minus length) written at the scalar position."""
  at = one_hot(position, length_dim, dtype=tf.int32)
  return ids * (1 - at) + new_ids * at


def _as_list(states):
  if states is None:
    return []
  return list(states) if isinstance(states, (list, tuple)) else [states]


@gin.configurable(module="beam_search")
def greedy_decode(logits_fn, initial_ids, temperature=0.0, initial_states=None,
                  eos_id=EOS_ID, forced_ids=None, use_tpu=True, max_steps=None):
  """Decodes by argmax (temperature 0) or by sampling softmax(logits / temperature).

  Args:
    logits_fn: fn(step_num, ids, states) -> (logits, new_states); see the module doc.
    initial_ids: int32 [batch..., length]; nonzero ids are kept, zeros are decoded.
    temperature: a float or an mtf Tensor broadcastable to the ids minus length.
    initial_states: list of mtf Tensors threaded through logits_fn (or None).
    eos_id: the id that ends a sequence.
    forced_ids: optional int32 Tensor shaped like initial_ids; its nonzero ids are
      written instead of the sampled ones (they do not end a sequence).
    use_tpu: accepted for compatibility; every backend runs the same loop.
    max_steps: if given, at most this many positions are decoded (an extension; the
      rest stay as given).

  Returns:
    int32 Tensor shaped like initial_ids: the decoded sequences, 0 after each EOS.
  """
  del use_tpu
  _check_ids(initial_ids, 1, "greedy_decode")
  mesh = initial_ids.mesh
  length_dim = initial_ids.shape.dims[-1]
  pinned = initial_ids
  if forced_ids is not None:
    if forced_ids.shape != initial_ids.shape:
      raise ShapeError("greedy_decode: forced_ids %s %s must have the shape of "
                       "initial_ids %s" % (forced_ids.name, forced_ids.shape,
                                            initial_ids.shape), tensor=forced_ids.name)
    pinned = ew.where(ew.equal(initial_ids, 0), forced_ids, initial_ids)
  row_dims = initial_ids.shape.dims[:-1]
  states = _as_list(initial_states)
  done = ew.equal(fill(mesh, row_dims, 0, tf.int32), 1)

  start = _decode_start(initial_ids, length_dim)
  end = length_dim.size if max_steps is None else ew.minimum(start + max_steps,
                                                             length_dim.size)

  def cond_fn(step_num, unused_ids, done, *unused_states):
    return ew.logical_and(ew.less(step_num, end),
                          ew.logical_not(reduce_ops.reduce_all(done)))

  def body_fn(step_num, ids, done, *states):
    logits, new_states = logits_fn(step_num, ids, list(states))
    vocab_dim = _vocab_dim(logits, row_dims, "greedy_decode")
    sampled = sample_with_temperature(logits, vocab_dim, temperature)
    given = gather(pinned, step_num, length_dim)
    generated = ew.equal(given, 0)
    new_ids = ew.where(generated, sampled, given)
    new_ids = ew.where(done, 0 * new_ids, new_ids)
    new_done = ew.logical_or(done, ew.logical_and(generated, ew.equal(new_ids, eos_id)))
    ids = _write_at(ids, step_num, new_ids, length_dim)
    return [step_num + 1, ids, new_done] + _as_list(new_states)

  return while_loop(cond_fn, body_fn, [start, pinned, done] + states)[1]


def _length_penalty(num_decoded, alpha, dtype):
  """((5 + len) / 6) ** alpha for an int32 scalar len."""
  return ew.mtf_pow((5.0 + ew.cast(num_decoded, dtype)) / 6.0, alpha)


def compute_topk_scores_and_seq(sequences, scores, scores_to_gather, flags, beam_dim,
                                prefix="default"):
  """Keeps the beam_dim.size best candidates by scores, with their state.

  Args:
    sequences: int32 [batch..., candidates, length].
    scores: [batch..., candidates], the ranking scores.
    scores_to_gather: [batch..., candidates], values to carry along (e.g. log probs).
    flags: bool [batch..., candidates] (e.g. "ends with EOS").
    beam_dim: the Dimension of the result (its size is how many are kept).
    prefix: a name for the ops.

  Returns:
    (top sequences, top scores_to_gather, top flags, selector) where selector is the
    float32 one-hot [batch..., beam, candidates] of the chosen candidates.
  """
  candidates_dim = sequences.shape.dims[-2]
  _, indices = top_k(scores, candidates_dim, beam_dim, name=prefix + "/top_k")

  def pick(x):
    return _pick(x, indices, candidates_dim, beam_dim)
  top_flags = ew.equal(pick(ew.cast(flags, tf.int32)), 1)
  selector = one_hot(indices, candidates_dim, dtype=tf.float32)
  return pick(sequences), pick(scores_to_gather), top_flags, selector


def _top_candidates(log_probs, beam_dim, vocab_dim, batch_dims, num_prefilter):
  """(scores, source beam, token id), each [batch..., double_beam]: the 2*beam best
  (beam, token) pairs of [batch..., beam, vocab] scores (after the prefilter, which for
  num_prefilter >= 2 cannot drop any of them)."""
  token_ids = None
  cand_dim = vocab_dim
  if num_prefilter and num_prefilter * beam_dim.size < vocab_dim.size:
    cand_dim = Dimension(_PREFILTER, num_prefilter * beam_dim.size)
    log_probs, token_ids = top_k(log_probs, vocab_dim, cand_dim)
  flat_dim = Dimension(_BEAM_AND_VOCAB, beam_dim.size * cand_dim.size)
  log_probs = transpose(log_probs, batch_dims + [beam_dim, cand_dim])
  flat = reshape(log_probs, batch_dims + [flat_dim])
  # beam search keeps 2*beam candidates; a tiny vocab may offer fewer.
  double_beam = Dimension(_DOUBLE_BEAM, min(2 * beam_dim.size, flat_dim.size))
  top_scores, flat_index = top_k(flat, flat_dim, double_beam)
  source_beam = flat_index // cand_dim.size
  if token_ids is None:
    tokens = flat_index % cand_dim.size
  else:
    token_ids = reshape(transpose(token_ids, batch_dims + [beam_dim, cand_dim]),
                        batch_dims + [flat_dim])
    tokens = gather(token_ids, flat_index, flat_dim, output_shape=batch_dims + [double_beam])
  return top_scores, source_beam, tokens


def _pick(x, indices, dim, new_dim):
  """x gathered along dim at indices [batch..., new_dim] (new_dim possibly dim itself).

  Where x's dims are [batch..., dim, ...] (the sequences, scores and caches of the
  search), a local batched tf.gather: one copy of x. Elsewhere mtf.gather, which lowers
  as a one-hot einsum since the indices share the batch dims (it reads x new_dim times).
  """
  batch = indices.shape.dims[:-1]
  if (indices.shape.dims[-1] == new_dim and x.shape.dims[:len(batch)] == batch
      and x.shape.dims[len(batch)] == dim):
    if x.dtype == tf.bool:
      return ew.equal(_pick(ew.cast(x, tf.int32), indices, dim, new_dim), 1)
    axis = len(batch)
    out_shape = Shape(batch + [new_dim] + x.shape.dims[axis + 1:])
    return slicewise(
        lambda t, i: tf.gather(t, i, axis=axis, batch_dims=axis), [x, indices],
        output_shape=out_shape, output_dtype=x.dtype,
        splittable_dims=[d for d in out_shape.dims if d not in (dim, new_dim)],
        name="pick_beams")
  if new_dim == dim:
    old_dim = Dimension("old_" + dim.name, dim.size)
    x, dim = rename_dimension(x, dim.name, old_dim.name), old_dim
  out_shape = Shape([new_dim if d == dim else d for d in x.shape.dims])
  if x.dtype == tf.bool:
    return ew.equal(gather(ew.cast(x, tf.int32), indices, dim, output_shape=out_shape), 1)
  return gather(x, indices, dim, output_shape=out_shape)


@gin.configurable(module="beam_search")
def beam_search(logits_fn, initial_ids, alpha, states=None, eos_id=EOS_ID,
                stop_early=True, decode_length=None, use_tpu=True, dtype=tf.float32,
                layout=None, mesh_shape=None, num_prefilter=2):
  """Beam search with the length penalty ((5 + len) / 6) ** alpha.

  A candidate's score is its summed log-probability divided by the penalty, where len
  counts the positions decoded so far (from the first position that holds a 0 in any
  sequence). The search keeps the beam best unfinished sequences and the beam best
  finished ones (ended by EOS); with stop_early it stops once no unfinished sequence can
  beat the worst finished one.

  Args:
    logits_fn: fn(step_num, ids, states) -> (logits, new_states); ids and logits carry
      the beam dim; every state that has the beam dim is reordered with the beams.
    initial_ids: int32 [batch..., beam, length]; nonzero ids are forced (a prompt),
      zeros are decoded. Only beam 0 starts alive.
    alpha: the length-penalty exponent.
    states: list of mtf Tensors threaded through logits_fn (or None).
    eos_id: the id that finishes a sequence.
    stop_early: stop when the finished beams cannot be beaten (else run to the end).
    decode_length: at most this many positions are decoded: an int, a scalar int
      Tensor, or None (up to the length).
    use_tpu, layout, mesh_shape: accepted for compatibility; the loop is the same on
      every backend and layout.
    dtype: float dtype of the scores.
    num_prefilter: each beam first keeps its num_prefilter*beam best tokens (None or 0:
      no prefilter). Values >= 2 give exactly the same result as no prefilter.

  Returns:
    (decoded_ids int32 [batch..., beam, length], scores [batch..., beam]), best first;
    the finished beams of a batch element, or its alive beams if none finished.
  """
  del use_tpu, layout, mesh_shape
  _check_ids(initial_ids, 2, "beam_search")
  if isinstance(decode_length, Tensor):
    if decode_length.shape.ndims or not decode_length.dtype.is_integer:
      raise ShapeError("beam_search: decode_length %s must be a scalar int Tensor, not "
                       "%s %s" % (decode_length.name, decode_length.shape,
                                  decode_length.dtype.name), tensor=decode_length.name)
    decode_length = ew.cast(decode_length, tf.int32)
  elif decode_length is not None and (not isinstance(decode_length, int) or
                                      decode_length < 1):
    raise ShapeError("beam_search: decode_length=%r must be a positive int or a scalar "
                     "int Tensor" % (decode_length,), tensor=initial_ids.name)
  mesh = initial_ids.mesh
  dtype = tf.as_dtype(dtype)
  length_dim, beam_dim = initial_ids.shape.dims[-1], initial_ids.shape.dims[-2]
  batch_dims = initial_ids.shape.dims[:-2]
  row_dims = batch_dims + [beam_dim]
  states = _as_list(states)
  start = _decode_start(initial_ids, length_dim)
  end = start + (length_dim.size if decode_length is None else decode_length)
  end = ew.minimum(end, length_dim.size)
  max_penalty = _length_penalty(end - start, alpha, dtype)

  alive_log_probs = one_hot(constant(mesh, 0, Shape(batch_dims), tf.int32), beam_dim,
                            on_value=0.0, off_value=-INF, dtype=dtype)
  finished_scores = fill(mesh, row_dims, -INF, dtype)
  finished_flags = ew.equal(fill(mesh, row_dims, 0, tf.int32), 1)

  def cond_fn(step, unused_alive, alive_log_probs, unused_finished, finished_scores,
              finished_flags, *unused_states):
    running = ew.less(step, end)
    if not stop_early:
      return running
    best_alive = reduce_ops.reduce_max(alive_log_probs, reduced_dim=beam_dim) / max_penalty
    # An empty finished slot counts as -INF, so every slot must be filled first.
    worst_finished = reduce_ops.reduce_min(ew.where(finished_flags, finished_scores, -INF),
                                           reduced_dim=beam_dim)
    bound_met = reduce_ops.reduce_all(ew.greater(worst_finished, best_alive))
    return ew.logical_and(running, ew.logical_not(bound_met))

  def body_fn(step, alive_seq, alive_log_probs, finished_seq, finished_scores,
              finished_flags, *states):
    logits, new_states = logits_fn(step, alive_seq, list(states))
    vocab_dim = _vocab_dim(logits, row_dims, "beam_search")
    log_probs = reduce_ops.log_softmax(ew.cast(logits, dtype), vocab_dim)
    given = gather(initial_ids, step, length_dim)
    forced = ew.not_equal(given, 0)
    token_range = mtf_range(mesh, vocab_dim, tf.int32)
    # A forced token costs nothing; the other tokens are impossible there.
    forced_log_probs = ew.cast(ew.equal(token_range, given), dtype) * INF - INF
    log_probs = ew.where(forced, forced_log_probs, log_probs) + alive_log_probs
    penalty = _length_penalty(step + 1 - start, alpha, dtype)
    top_scores, source_beam, tokens = _top_candidates(
        log_probs / penalty, beam_dim, vocab_dim, batch_dims, num_prefilter)
    double_beam = tokens.shape.dims[-1]
    top_log_probs = top_scores * penalty
    top_seq = _write_at(_pick(alive_seq, source_beam, beam_dim, double_beam), step, tokens,
                        length_dim)
    was_forced = _pick(forced, source_beam, beam_dim, double_beam)
    top_finished = ew.logical_and(
        ew.logical_and(ew.equal(tokens, eos_id), ew.logical_not(was_forced)),
        ew.greater(top_log_probs, -INF / 2))

    # The beam best unfinished candidates stay alive.
    alive_candidates = ew.where(top_finished, -INF, top_log_probs)
    _, alive_index = top_k(alive_candidates, double_beam, beam_dim)
    new_alive_seq = _pick(top_seq, alive_index, double_beam, beam_dim)
    new_alive_log_probs = _pick(alive_candidates, alive_index, double_beam, beam_dim)
    alive_source = _pick(source_beam, alive_index, double_beam, beam_dim)
    new_states = [_pick(s, alive_source, beam_dim, beam_dim)
                  if beam_dim in s.shape.dims else s for s in _as_list(new_states)]

    # The beam best finished sequences among the old ones and the new candidates.
    def joined(old, new):
      return concat([rename_dimension(old, beam_dim.name, _CANDIDATES),
                     rename_dimension(new, double_beam.name, _CANDIDATES)], _CANDIDATES)
    new_finished_seq, new_finished_scores, new_finished_flags, _ = (
        compute_topk_scores_and_seq(
            joined(finished_seq, top_seq),
            joined(finished_scores, ew.where(top_finished, top_scores, -INF)),
            joined(finished_scores, ew.where(top_finished, top_scores, -INF)),
            joined(finished_flags, top_finished), beam_dim, prefix="grow_finished"))
    return [step + 1, new_alive_seq, new_alive_log_probs, new_finished_seq,
            new_finished_scores, new_finished_flags] + new_states

  outputs = while_loop(
      cond_fn, body_fn,
      [start, initial_ids, alive_log_probs, initial_ids, finished_scores, finished_flags]
      + states)
  step, alive_seq, alive_log_probs, finished_seq, finished_scores, finished_flags = (
      outputs[:6])
  any_finished = reduce_ops.reduce_any(finished_flags, reduced_dim=beam_dim)
  alive_scores = alive_log_probs / _length_penalty(step - start, alpha, dtype)
  decoded = ew.where(any_finished, finished_seq, alive_seq)
  scores = ew.where(any_finished, finished_scores, alive_scores)
  return decoded, scores
