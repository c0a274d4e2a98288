"""mtf.beam_search (mesh_tf/beam_search.py) on a bigram "model": greedy decoding and
sampling against numpy, beam search against an exhaustive search over all sequences,
and the same results on every layout and backend."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import new_mesh

EOS = mtf.beam_search.EOS_ID
PREV = "prev"


def bigram_table(vocab, seed, scale=2.0):
  """Random next-token logits per previous token; PAD (0) is never likely."""
  table = np.random.RandomState(seed).normal(size=(vocab, vocab)).astype(np.float32)
  table *= scale
  table[:, 0] = -30.0
  return table


def log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def bigram_logits_fn(mesh, table, vocab_dim):
  """logits_fn(step, ids, states): the table row of the token before step (0 at 0)."""
  t = mtf.import_tf_tensor(mesh, table, [mtf.Dimension(PREV, table.shape[0]), vocab_dim])

  def logits_fn(step, ids, states):
    prev = mtf.gather(ids, step - 1, ids.shape.dims[-1])
    return mtf.gather(t, prev, mtf.Dimension(PREV, table.shape[0])), states
  return logits_fn


def numpy_greedy(table, ids, eos=EOS):
  """Reference greedy decode with the semantics of mtf.beam_search.greedy_decode."""
  out = ids.copy()
  start = min([list(row).index(0) for row in ids if 0 in row] or [ids.shape[-1]])
  for row in out:
    done = False
    for p in range(start, len(row)):
      if done:
        row[p] = 0
      elif row[p] == 0:
        row[p] = int(np.argmax(table[row[p - 1] if p else 0]))
        done = row[p] == eos
  return out


def all_finished_sequences(table, prompt, num_steps, alpha, eos=EOS):
  """Every continuation ending in its first EOS within num_steps, with its score."""
  logp = log_softmax(table.astype(np.float64))
  vocab = table.shape[0]
  results = []
  for n in range(1, num_steps + 1):
    for body in itertools.product([t for t in range(vocab) if t != eos], repeat=n - 1):
      seq = list(body) + [eos]
      prev, total = prompt[-1] if prompt else 0, 0.0
      for t in seq:
        total += logp[prev, t]
        prev = t
      results.append((total / ((5.0 + n) / 6.0) ** alpha, seq))
  return sorted(results, key=lambda r: -r[0])


def lower(graph, mesh, impl, tensors, traced=False):
  """Values of tensors lowered on impl, eagerly or inside a tf.function."""
  if not traced:
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t).numpy() for t in tensors]
  mtf.Lowering(graph, {mesh: impl})  # variables and constants outside the trace

  @tf.function
  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t) for t in tensors]
  return [t.numpy() for t in run()]


def mesh_impls():
  """One device, placement [2,2] splitting batch and vocab (2x2: placement lowers each
  device's ops eagerly, at every step), SIMD emulation [2,4]."""
  return {
      "single": lambda: mtf.PlacementMeshImpl("", "", ["/cpu:0"]),
      "placement_2x2": lambda: mtf.PlacementMeshImpl(
          "rows:2;cols:2", "batch:rows;vocab:cols", ["/cpu:%d" % i for i in range(4)]),
      "simd_2x4": lambda: mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;beam:cols"),
  }


# ------------------------------------------------------------------ greedy decoding
VOCAB8 = mtf.Dimension("vocab", 8)


def _greedy_graph(table, ids, temperature=0.0, forced=None):
  graph, mesh = new_mesh()
  dims = [mtf.Dimension("batch", ids.shape[0]), mtf.Dimension("length", ids.shape[1])]
  initial = mtf.import_tf_tensor(mesh, ids, dims)
  forced_ids = None if forced is None else mtf.import_tf_tensor(mesh, forced, dims)
  if isinstance(temperature, np.ndarray):
    temperature = mtf.import_tf_tensor(mesh, temperature, dims[:1])
  out = mtf.beam_search.greedy_decode(bigram_logits_fn(mesh, table, VOCAB8), initial,
                                      temperature=temperature, forced_ids=forced_ids)
  return graph, mesh, out


def _prompts(batch, length, seed):
  """Prompts of 0-3 random non-EOS tokens, zero-padded."""
  rng = np.random.RandomState(seed)
  ids = np.zeros((batch, length), np.int32)
  for row in ids:
    n = rng.randint(0, 4)
    row[:n] = rng.randint(2, 8, size=n)
  return ids


def test_greedy_decode_matches_numpy():
  table = bigram_table(8, seed=1)
  ids = _prompts(8, 10, seed=2)
  graph, mesh, out = _greedy_graph(table, ids)
  got = lower(graph, mesh, mesh_impls()["single"](), [out])[0]
  np.testing.assert_array_equal(got, numpy_greedy(table, ids))
  assert (got == EOS).any(), "the table should end some sequences"


def test_greedy_forced_ids_and_zero_temperature_tensor():
  table = bigram_table(8, seed=3)
  ids = _prompts(8, 9, seed=4)
  forced = np.zeros_like(ids)
  forced[:, 5] = 7  # pins position 5 of every row that has not ended yet
  # A temperature Tensor of zeros draws noise but scales it to nothing: still argmax.
  graph, mesh, out = _greedy_graph(table, ids, np.zeros([8], np.float32), forced)
  got = lower(graph, mesh, mesh_impls()["single"](), [out])[0]
  expected = ids.copy()
  for b, row in enumerate(expected):
    done = False
    for p in range(len(row)):
      if row[p] != 0 and p < (list(ids[b]) + [0]).index(0):
        continue
      if done:
        row[p] = 0
      elif forced[b, p]:
        row[p] = forced[b, p]
      else:
        row[p] = int(np.argmax(table[row[p - 1] if p else 0]))
        done = row[p] == EOS
  np.testing.assert_array_equal(got, expected)


def test_sampling_draws_fresh_noise_per_run():
  table = bigram_table(8, seed=7, scale=0.3)  # flat: many different samples
  ids = np.zeros((16, 6), np.int32)
  graph, mesh, out = _greedy_graph(table, ids, temperature=1.0)
  impl = mesh_impls()["single"]()
  first = lower(graph, mesh, impl, [out])[0]
  second = lower(graph, mesh, impl, [out])[0]
  again = lower(graph, mesh, mesh_impls()["single"](), [out])[0]  # a fresh MeshImpl
  np.testing.assert_array_equal(first, again)
  assert not np.array_equal(first, second)
  assert not np.array_equal(first, numpy_greedy(table, ids)), "not sampled"


def test_sampling_follows_softmax_of_temperature():
  table = bigram_table(8, seed=8, scale=1.0)
  ids = np.zeros((512, 1), np.int32)
  graph, mesh, out = _greedy_graph(table, ids, temperature=0.7)
  got = lower(graph, mesh, mesh_impls()["single"](), [out])[0][:, 0]
  freq = np.bincount(got, minlength=8) / got.size
  expected = np.exp(log_softmax(table[0] / 0.7))
  # 512 draws: each frequency's standard error is below 0.023; allow 4 of them.
  np.testing.assert_allclose(freq, expected, atol=0.09)


# ----------------------------------------------------------------------- beam search
def _beam_graph(table, ids, beam, alpha, decode_length=None, num_prefilter=2,
                vocab_name="vocab"):
  graph, mesh = new_mesh()
  vocab_dim = mtf.Dimension(vocab_name, table.shape[0])
  dims = [mtf.Dimension("batch", ids.shape[0]), mtf.Dimension("beam", beam),
          mtf.Dimension("length", ids.shape[1])]
  initial = mtf.import_tf_tensor(mesh, np.repeat(ids[:, None], beam, 1), dims)
  decoded, scores = mtf.beam_search.beam_search(
      bigram_logits_fn(mesh, table, vocab_dim), initial, alpha,
      decode_length=decode_length, num_prefilter=num_prefilter)
  return graph, mesh, decoded, scores


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_exhaustive_beam_equals_brute_force(alpha):
  """With 2*beam >= every candidate, the finished beams are the best sequences overall."""
  table = bigram_table(4, seed=10, scale=1.5)
  prompts = [[], [3], [2, 3]]
  ids = np.zeros((3, 5), np.int32)
  for row, p in zip(ids, prompts):
    row[:len(p)] = p
  # Row 0 decodes positions 0-2, rows 1-2 have prompts: the search starts at position 0
  # for all, forcing the prompt tokens, so each row gets 3 decoded positions at most.
  graph, mesh, decoded, scores = _beam_graph(table, ids, beam=18, alpha=alpha,
                                             decode_length=3)
  got_ids, got_scores = lower(graph, mesh, mesh_impls()["single"](), [decoded, scores])
  for b, prompt in enumerate(prompts):
    steps = 3 - len(prompt)
    # Forced prompt positions count in the length penalty, as decoded positions.
    ref = [(total_score, seq) for total_score, seq in
           all_finished_sequences(table, prompt, steps, alpha=0.0)]
    ref = sorted([(s * 1.0 / ((5.0 + len(prompt) + len(q)) / 6.0) ** alpha, q)
                  for s, q in ref], key=lambda r: -r[0])
    assert len(ref) <= 18
    for k, (score, seq) in enumerate(ref):
      expected = np.zeros(5, np.int32)
      expected[:len(prompt)] = prompt
      expected[len(prompt):len(prompt) + len(seq)] = seq
      np.testing.assert_array_equal(got_ids[b, k], expected, err_msg="row %d beam %d" % (
          b, k))
      np.testing.assert_allclose(got_scores[b, k], score, rtol=1e-5, atol=1e-5)
    assert (got_scores[b, len(ref):] <= -mtf.beam_search.INF / 2).all()


def test_small_beam_scores_are_true_scores_and_bounded_by_brute_force():
  table = bigram_table(6, seed=11, scale=1.5)
  ids = np.zeros((4, 4), np.int32)
  ids[1, 0], ids[2, 0], ids[3, 0] = 2, 3, 5
  alpha = 0.6
  graph, mesh, decoded, scores = _beam_graph(table, ids, beam=2, alpha=alpha)
  got_ids, got_scores = lower(graph, mesh, mesh_impls()["single"](), [decoded, scores])
  logp = log_softmax(table.astype(np.float64))
  for b in range(4):
    prompt = [int(ids[b, 0])] if ids[b, 0] else []
    best = all_finished_sequences(table, prompt, 4 - len(prompt), alpha=0.0)
    best = max(s / ((5.0 + len(prompt) + len(q)) / 6.0) ** alpha for s, q in best)
    for k in range(2):
      seq = list(got_ids[b, k])
      assert seq[:len(prompt)] == prompt
      if got_scores[b, k] <= -mtf.beam_search.INF / 2:
        continue  # an empty finished slot
      n = seq.index(EOS) + 1 if EOS in seq else len(seq)  # unfinished: alive beams
      assert all(t == 0 for t in seq[n:]) and 0 not in seq[:n]
      total = sum(logp[seq[p - 1] if p else 0, seq[p]] for p in range(len(prompt), n))
      np.testing.assert_allclose(got_scores[b, k], total / ((5.0 + n) / 6.0) ** alpha,
                                 rtol=1e-5)
      if EOS in seq:
        assert got_scores[b, k] <= best + 1e-5
    assert got_scores[b, 0] >= got_scores[b, 1]


@pytest.mark.parametrize("with_prompts", [False, True])
def test_beam_one_equals_greedy(with_prompts):
  table = bigram_table(8, seed=12)
  ids = _prompts(8, 10, seed=13) if with_prompts else np.zeros((8, 10), np.int32)
  graph, mesh, decoded, _ = _beam_graph(table, ids, beam=1, alpha=0.0)
  got = lower(graph, mesh, mesh_impls()["single"](), [decoded])[0][:, 0]
  np.testing.assert_array_equal(got, numpy_greedy(table, ids))


def test_prefilter_does_not_change_the_result():
  table = bigram_table(16, seed=14)
  ids = _prompts(4, 6, seed=15)
  results = []
  for prefilter in [2, None]:
    graph, mesh, decoded, scores = _beam_graph(table, ids, beam=3, alpha=0.6,
                                               num_prefilter=prefilter)
    results.append(lower(graph, mesh, mesh_impls()["single"](), [decoded, scores]))
  np.testing.assert_array_equal(results[0][0], results[1][0])
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)


def test_same_decodes_on_every_backend_eagerly_and_traced():
  """Greedy, sampled and beam decodes of one graph: identical on one device, placement
  [2,2] (batch and vocab split) and SIMD emulation [2,4] (batch and beam split)."""
  table = bigram_table(8, seed=16)
  ids = _prompts(2, 5, seed=17)
  graph, mesh = new_mesh()
  batch, beam = mtf.Dimension("batch", 2), mtf.Dimension("beam", 4)
  length = mtf.Dimension("length", 5)
  logits_fn = bigram_logits_fn(mesh, table, VOCAB8)
  initial = mtf.import_tf_tensor(mesh, ids, [batch, length])
  greedy = mtf.beam_search.greedy_decode(logits_fn, initial)
  sampled = mtf.beam_search.greedy_decode(logits_fn, initial, temperature=1.0)
  beams, scores = mtf.beam_search.beam_search(
      logits_fn, mtf.broadcast(initial, [batch, beam, length]), 0.6)
  outs = [greedy, sampled, beams, scores]
  runs = {"single": lower(graph, mesh, mesh_impls()["single"](), outs),
          "single traced": lower(graph, mesh, mesh_impls()["single"](), outs, True),
          "placement_2x2": lower(graph, mesh, mesh_impls()["placement_2x2"](), outs),
          "simd_2x4": lower(graph, mesh, mesh_impls()["simd_2x4"](), outs)}
  np.testing.assert_array_equal(runs["single"][0], numpy_greedy(table, ids))
  for name, got in runs.items():
    for value, ref, what in zip(got, runs["single"], ["greedy", "sampled", "beams"]):
      np.testing.assert_array_equal(value, ref, err_msg="%s: %s" % (name, what))
    np.testing.assert_allclose(got[3], runs["single"][3], rtol=1e-5, err_msg=name)


def test_beam_search_reorders_states_with_the_beams():
  """A state counting each beam's decoded tokens follows its beam through reordering."""
  table = bigram_table(6, seed=18)
  graph, mesh = new_mesh()
  vocab_dim = mtf.Dimension("vocab", 6)
  dims = [mtf.Dimension("batch", 2), mtf.Dimension("beam", 3), mtf.Dimension("length", 6)]
  initial = mtf.zeros(mesh, dims, tf.int32)
  bigram = bigram_logits_fn(mesh, table, vocab_dim)

  def logits_fn(step, ids, states):
    logits, _ = bigram(step, ids, states)
    # states[0]: the sum of the ids so far, per beam.
    return logits, [mtf.reduce_sum(ids, reduced_dim=dims[2])]
  decoded, _ = mtf.beam_search.beam_search(
      logits_fn, initial, 0.0, states=[mtf.zeros(mesh, dims[:2], tf.int32)],
      stop_early=False)
  got = lower(graph, mesh, mesh_impls()["single"](), [decoded])[0]
  assert got.shape == (2, 3, 6) and (got[:, 0] != 0).any()


@pytest.mark.parametrize("impl", ["single", "placement_2x2", "simd_2x4"])
def test_state_reorder_takes_each_rows_source_beams(impl):
  """The loop's reorder of a cache [batch, beam, heads, length, d] (a batched gather)
  and of a state whose dims do not start with [batch, beam] (the one-hot einsum), and
  its picks of sequences and flags from [batch, candidates, length], give numpy's
  take_along_axis, also with the beam dim split (simd_2x4)."""
  graph, mesh = new_mesh()
  batch, beam = mtf.Dimension("batch", 2), mtf.Dimension("beam", 4)
  rest = [mtf.Dimension("heads", 2), mtf.Dimension("memory_length", 3),
          mtf.Dimension("d_kv", 2)]
  cache_np = np.random.RandomState(30).normal(size=(2, 4, 2, 3, 2)).astype(np.float32)
  source_np = np.array([[3, 3, 0, 1], [2, 0, 1, 1]], np.int32)
  cache = mtf.import_tf_tensor(mesh, cache_np, [batch, beam] + rest)
  source = mtf.import_tf_tensor(mesh, source_np, [batch, beam])
  other = mtf.transpose(cache, [rest[0], batch] + rest[1:] + [beam])
  pick = mtf.beam_search._pick  # pylint: disable=protected-access
  outs = [pick(cache, source, beam, beam), pick(other, source, beam, beam)]
  assert outs[0].operation.name.startswith("pick_beams")
  assert not outs[1].operation.name.startswith("pick_beams")
  # the search's sequences [batch, candidates, length] (ints and bools) to a smaller dim
  candidates, length = mtf.Dimension("candidates", 6), mtf.Dimension("length", 5)
  seq_np = np.random.RandomState(31).randint(0, 50, size=(2, 6, 5)).astype(np.int32)
  chosen_np = np.array([[5, 0, 2, 2], [1, 3, 4, 0]], np.int32)
  seq = mtf.import_tf_tensor(mesh, seq_np, [batch, candidates, length])
  chosen = mtf.import_tf_tensor(mesh, chosen_np, [batch, beam])
  outs += [pick(seq, chosen, candidates, beam),
           pick(mtf.equal(seq, 7), chosen, candidates, beam)]
  assert outs[2].shape.dims == [batch, beam, length]
  got = lower(graph, mesh, mesh_impls()[impl](), outs)
  want = np.take_along_axis(cache_np, source_np[:, :, None, None, None], axis=1)
  np.testing.assert_array_equal(got[0], want)
  np.testing.assert_array_equal(got[1], want.transpose(2, 0, 3, 4, 1))
  picked = np.take_along_axis(seq_np, chosen_np[:, :, None], axis=1)
  np.testing.assert_array_equal(got[2], picked)
  np.testing.assert_array_equal(got[3], picked == 7)


# ----------------------------------------------------------------------------- errors
def test_decoding_errors_name_the_tensor():
  graph, mesh = new_mesh()
  dims = [mtf.Dimension("batch", 2), mtf.Dimension("length", 4)]
  floats = mtf.zeros(mesh, dims)
  with pytest.raises(mtf.ShapeError, match="int32"):
    mtf.beam_search.greedy_decode(lambda s, i, st: (None, st), floats)
  ids = mtf.zeros(mesh, dims, tf.int32)
  with pytest.raises(mtf.ShapeError, match=r"\[batch..., beam, length\]"):
    mtf.beam_search.beam_search(lambda s, i, st: (None, st), mtf.zeros(
        mesh, dims[1:], tf.int32), 0.6)
  with pytest.raises(mtf.ShapeError, match="decode_length"):
    mtf.beam_search.beam_search(lambda s, i, st: (None, st), ids, 0.6, decode_length=0)
  with pytest.raises(mtf.ShapeError, match="forced_ids"):
    mtf.beam_search.greedy_decode(lambda s, i, st: (None, st), ids,
                                  forced_ids=mtf.zeros(mesh, dims[:1], tf.int32))
  wrong = mtf.zeros(mesh, [mtf.Dimension("other", 2), mtf.Dimension("vocab", 3)])
  with pytest.raises(mtf.ShapeError, match="one vocabulary dim"):
    mtf.beam_search.greedy_decode(lambda s, i, st: (wrong, st), ids)


def test_gin_configurable_under_beam_search_module():
  import gin  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.parse_config("beam_search.beam_search.num_prefilter = 3\n"
                     "beam_search.greedy_decode.eos_id = 5")
  try:
    assert gin.query_parameter("beam_search.beam_search.num_prefilter") == 3
    assert gin.query_parameter("beam_search.greedy_decode.eos_id") == 5
  finally:
    gin.clear_config()
