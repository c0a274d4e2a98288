"""Cached decoding speed of the README LM: tokens/s of greedy decoding, sampling
(temperature 1, all ids) and beam search (4 beams), on one device and on the README's
2x2 mesh (dp+mp), and the time per decoded position at several numbers of new tokens,
next to the original library's cached decoding of the same model and weights.

The model is the `make train` LM (gin_configs/models/lm_cpu_small.gin + readme_lm.gin:
2 layers, d_model 64, d_ff 256, 4 heads of 16, byte vocabulary of 259 ids padded to
384, batch 16), `max_length` bound to prompt + new tokens. Each decode is one
tf.function (as the trainer's decode mode runs it, decode_io.DecodeGraph) decoding
`new tokens` positions after a `prompt_length`-token prompt, never stopping at EOS
(greedy and sampling; beam search runs to the end of the length unless its own test
stops it earlier, as the original's does). All decodes (every case and length) are
timed in alternating rounds in the same run (median of --repeats). Each mesh is
measured by a process of its own with the thread pools the trainer's decode mode gives
it (TF's own for one device; one thread per op on 2x2 on a 2-core host;
mesh_tf.cpu_threads).

Rows: case x mesh. Columns: ms per decoded position (the whole batch) at each length
and their max/min (flat = 1.0); ms per step of the decoding loop at each length, (time
of the decode - time of a decode of 1 new token) / (new tokens - 1), which leaves out
the fixed cost of a call (the prefill, the loop's set-up), and their max/min; tokens/s
(batch x new tokens / s) at --compare_tokens
new tokens, and, when the original library's environment exists (--original_python, a
TF 2.12 venv with mesh-tensorflow 0.1.21; see benchmarks/original_decode.py), its
tokens/s for the same case in a subprocess, port/original, and whether greedy ids agree
(the original restores the port's checkpoint by variable name).

With --plain_tf (default), greedy decoding written by hand in plain TF
(benchmarks/plain_tf_decode.py: the same model on the same checkpoint, one device) is
timed in the same rounds, attending over the caches' whole length as mesh_tf does
("static") and over the filled prefix only ("prefix"), and its ids are checked against
mesh_tf's: the floor that TF itself sets for the time per position and its flatness.

Greedy cached ids are also checked against the recompute path (the whole prefix through
the model at every step) at the smallest length on one device.

  python -m benchmarks.decode_speed [--new_tokens 16,64,256 --repeats 3 --size small
      --meshes 1,2x2 --cases greedy,sampling,beam4 --original_python PATH --plain_tf]
"""
import json
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

from benchmarks import common  # sets TF's log level before TF is imported
import tensorflow as tf  # pylint: disable=g-bad-import-order

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_list, "new_tokens", ["16", "64", "256"],
                   "Numbers of tokens to decode.")
common.define_flag(flags.DEFINE_integer, "compare_tokens", None,
                   "New tokens of the tokens/s columns and "
                   "the original's run (default: the middle of --new_tokens).")
common.define_flag(flags.DEFINE_integer, "prompt_length", 8,
                   "Prompt tokens per sequence.")
common.define_flag(flags.DEFINE_integer, "repeats", 3,
                   "Timed decodes per case and length (median).")
common.define_flag(flags.DEFINE_enum, "size", "small", list(common.TRANSFORMER_SIZES),
                   "small: the make train model; tiny: a smaller one for smoke tests.")
common.define_flag(flags.DEFINE_list, "cases", ["greedy", "sampling", "beam4"],
                   "Decoding cases.")
common.define_flag(flags.DEFINE_list, "meshes", ["1", "2x2"],
                   "Meshes: 1 (one device), 2x2 (dp+mp).")
common.define_flag(flags.DEFINE_string, "original_python", "/tmp/tf212/bin/python",
                   "Python of the original library's venv ('' to skip).")
common.define_flag(flags.DEFINE_boolean, "size_thread_pools", True,
                   "Size TF's thread pools for a mesh's devices as the trainer's decode "
                   "mode does (mesh_tf.cpu_threads; TF's own for one device); false: "
                   "TF's own sizes for every mesh.")
common.define_flag(flags.DEFINE_boolean, "in_process", False,
                   "Measure every mesh in this process (pools sized for the largest); "
                   "by default each mesh of several runs in a process of its own.")
common.define_flag(flags.DEFINE_boolean, "check_recompute", True,
                   "Check greedy cached ids against the "
                   "recompute path at the smallest length (one device).")
common.define_flag(flags.DEFINE_boolean, "original_every_length", True,
                   "Run the original at every --new_tokens (its ms/pos max/min "
                   "column); false: at --compare_tokens only.")
common.define_flag(flags.DEFINE_boolean, "plain_tf", True,
                   "Also time greedy decoding written by hand in plain TF "
                   "(benchmarks/plain_tf_decode.py) on one device, with static and "
                   "prefix attention.")
common.define_flag(flags.DEFINE_string, "json_out", None,
                   "Also write the results here as JSON.")

GIN_FILES = ["models/lm_cpu_small.gin", "readme_lm.gin"]
CASES = {"greedy": dict(temperature=0.0, beam=1),
         "sampling": dict(temperature=1.0, beam=1),
         "beam4": dict(temperature=0.0, beam=4)}
MESHES = {"1": ("", "", 1),
          "2x2": ("batch:2;model:2", "batch:batch;d_ff:model;heads:model;vocab:model", 4)}
MESH_LABELS = {"1": "1 device", "2x2": "2x2 dp+mp"}
# Rows of plain TF's greedy decoding (one device), by its attention.
PLAIN_TF = {"plain static": "1 device, plain TF, static attention",
            "plain prefix": "1 device, plain TF, prefix attention"}
SEED = 1234


def _bindings(size, max_length):
  bindings = ["Unitransformer.max_length = %d" % max_length]
  if size != "small":
    s = common.TRANSFORMER_SIZES[size]
    bindings += ["%s = %d" % (k, s[k])
                 for k in ("num_layers", "d_model", "d_ff", "num_heads", "d_kv")]
  return bindings


def build_decode(size, mesh_key, case, length, new_tokens, cached=True):
  """(graph, mesh, prompts placeholder, decoded ids [batch, length]) of one case on
  the gin-configured LM: the cached path (or the recompute path, cached=False)."""
  import gin  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.transformer import decoding, utils  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  s = common.TRANSFORMER_SIZES[size]
  mesh_shape, layout, _ = MESHES[mesh_key]
  spec = CASES[case]
  gin.clear_config()
  try:
    gin_setup.parse_gin(GIN_FILES, _bindings(size, length))
    model = utils.build_model(model_type="lm", input_vocab_size=s["vocab"],
                              output_vocab_size=s["vocab"], layout_rules=layout or None,
                              mesh_shape=mesh_shape or None)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    dims = [mtf.Dimension("batch", s["batch"]), mtf.Dimension("length", length)]
    prompts = mtf.import_tf_tensor(mesh, tf.TensorSpec([s["batch"], length], tf.int32),
                                   dims, name="prompts")
    variable_dtype = utils.get_variable_dtype()
    with decoding.decoding_mode(cached):
      if cached and not decoding.supports_incremental_decoding(model):
        raise ValueError("the model does not support cached decoding")
      if spec["beam"] > 1:
        beam_dims = dims[:1] + [mtf.Dimension("beam", spec["beam"])] + dims[1:]
        ids = model.beam_search(mtf.broadcast(prompts, beam_dims), decode_length=length,
                                alpha=0.6, variable_dtype=variable_dtype)
      else:
        ids = model.sample_autoregressive(prompts, never_end=True, max_steps=new_tokens,
                                          temperature=spec["temperature"],
                                          variable_dtype=variable_dtype)
    return graph, mesh, prompts, ids
  finally:
    gin.clear_config()


random_prompts = common.random_prompts


def mesh_impl(mesh_key, devices):
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  mesh_shape, layout, n = MESHES[mesh_key]
  return mtf.PlacementMeshImpl(mesh_shape, layout, devices[:n])


def decode_fn(size, mesh_key, case, new_tokens, prompt_length, checkpoint, devices,
              cached=True):
  """A zero-argument tf.function decoding the prompts (the weights of checkpoint,
  written first with seeded initial values if it does not exist)."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  length = prompt_length + new_tokens
  prompts = tf.constant(random_prompts(size, length, prompt_length))
  graph, mesh, placeholder, ids = build_decode(size, mesh_key, case, length, new_tokens,
                                               cached)
  impl = mesh_impl(mesh_key, devices)
  tf.random.set_seed(SEED)
  lowering = mtf.Lowering(graph, {mesh: impl})  # creates the variables
  if os.path.exists(checkpoint + ".index"):
    mtf.restore_checkpoint(checkpoint, lowering)
  else:
    mtf.save_checkpoint(checkpoint, lowering)
  tf.random.set_seed(SEED)

  # As decode_io.DecodeGraph.make_decode_fn (jit_compile only where the backend needs it).
  @tf.function(jit_compile=impl.needs_xla)
  def decode():
    return mtf.Lowering(graph, {mesh: impl}, feeds={placeholder: prompts}
                        ).export_to_tf_tensor(ids)
  return decode


def run_original(python, size, cases, meshes, new_tokens, prompt_length, repeats,
                 checkpoint_dir):
  """The original's results ({"case/mesh": {"tok_s":, "ids":}}), or (None, why)."""
  script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "original_decode.py")
  s = common.TRANSFORMER_SIZES[size]
  args = [python, script, "--checkpoint_dir", checkpoint_dir,
          "--new_tokens", str(new_tokens), "--prompt_length", str(prompt_length),
          "--repeats", str(repeats), "--cases", ",".join(cases),
          "--meshes", ",".join(meshes), "--max_length", str(prompt_length + new_tokens)]
  for k in ("batch", "vocab", "num_layers", "d_model", "d_ff", "num_heads", "d_kv"):
    args += ["--" + k, str(s[k])]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
  env.pop("PYTHONPATH", None)
  proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
  if proc.returncode:
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return None, "original_decode.py failed (rc %d): %s" % (proc.returncode, last)
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith("{"):
      return json.loads(line), None
  return None, "original_decode.py printed no JSON"


def plain_tf_fns(size, prompt_length, new_tokens, checkpoint):
  """{PLAIN_TF key: zero-argument tf.function} of plain TF's greedy decoding of the
  prompts decode_fn decodes, on the weights of checkpoint."""
  from benchmarks import plain_tf_decode  # pylint: disable=g-import-not-at-top
  s = common.TRANSFORMER_SIZES[size]
  length = prompt_length + new_tokens
  weights = plain_tf_decode.load_weights(checkpoint, s["num_layers"])
  prompts = random_prompts(size, length, prompt_length)
  return {key: plain_tf_decode.make_greedy_decode(weights, prompts, prompt_length,
                                                  s["num_heads"], s["vocab"],
                                                  attend=key.split()[1])
          for key in PLAIN_TF}


def measure(size, cases, meshes, new_tokens_list, prompt_length, repeats, devices,
            workdir, check_recompute=True, plain_tf=False):
  """{"times": {(case, mesh): {n: s per decode}}, "ids": {(case, mesh, n): ids},
  "recompute_same": bool or None, "checkpoints": {n: dir}, "plain_same": bool or None}.
  plain_tf (with greedy on one device): also plain TF's greedy decoding, as the
  ("greedy", PLAIN_TF key) entries; plain_same: its ids equal mesh_tf's at every
  length."""
  plain_tf = plain_tf and "greedy" in cases and "1" in meshes
  times = {(c, m): {} for c in cases for m in meshes}
  times.update({("greedy", key): {} for key in (PLAIN_TF if plain_tf else ())})
  plain_same = True if plain_tf else None
  all_ids, checkpoints, recompute_same = {}, {}, None
  all_fns = {}
  for n in sorted(set(new_tokens_list) | {1}):  # 1: the fixed cost of a decode
    ckpt_dir = os.path.join(workdir, "ckpt_%d" % n)
    os.makedirs(ckpt_dir, exist_ok=True)
    checkpoint = os.path.join(ckpt_dir, "model.ckpt")
    checkpoints[n] = ckpt_dir
    fns = {(c, m): decode_fn(size, m, c, n, prompt_length, checkpoint, devices)
           for m in meshes for c in cases}
    if plain_tf:
      fns.update({("greedy", key): fn for key, fn in
                  plain_tf_fns(size, prompt_length, n, checkpoint).items()})
    for key, fn in fns.items():
      all_ids[key + (n,)] = fn().numpy()  # also traces
    if plain_tf:
      plain_same = plain_same and all(
          np.array_equal(all_ids[("greedy", key, n)], all_ids[("greedy", "1", n)])
          for key in PLAIN_TF)
    if (check_recompute and recompute_same is None and n == min(new_tokens_list)
        and "greedy" in cases and "1" in meshes):
      recompute = decode_fn(size, "1", "greedy", n, prompt_length, checkpoint, devices,
                            cached=False)
      recompute_same = bool(np.array_equal(recompute().numpy(),
                                           all_ids[("greedy", "1", n)]))
    all_fns.update({key + (n,): fn for key, fn in fns.items()})
  # every length in every round: a slow stretch of the host then falls on all of them
  for (c, m, n), t in common.time_alternating(all_fns, 1, repeats).items():
    times[(c, m)][n] = t
  return dict(times=times, ids=all_ids, recompute_same=recompute_same,
              checkpoints=checkpoints, plain_same=plain_same)


def table(size, cases, meshes, new_tokens_list, compare_tokens, results, original):
  """The rows (header first) of the results."""
  batch = common.TRANSFORMER_SIZES[size]["batch"]
  header = (["case", "mesh"] + ["ms/pos @%d" % n for n in new_tokens_list]
            + ["max/min"] + ["ms/step @%d" % n for n in new_tokens_list]
            + ["step max/min", "tok/s @%d" % compare_tokens])
  by_length = (original or {}).get("_by_length")
  if original is not None:
    header += ["orig tok/s", "port/orig", "greedy ids = orig"]
    if by_length:  # the original's ms/pos max/min over the same lengths
      header += ["orig max/min"]
  rows = [header]
  for c in cases:
    for m in list(meshes) + [k for k in PLAIN_TF if (c, k) in results["times"]]:
      t = results["times"][(c, m)]
      per_pos = [t[n] / n * 1000 for n in new_tokens_list]
      # the loop's own cost per step: a decode less the one of a single new token
      # (the call, the prefill, the loop's set-up and its first step)
      per_step = [(t[n] - t[1]) / (n - 1) * 1000 for n in new_tokens_list]
      tok_s = batch * compare_tokens / t[compare_tokens]
      row = ([c, MESH_LABELS.get(m) or PLAIN_TF[m]] + ["%.2f" % p for p in per_pos]
             + ["%.2f" % (max(per_pos) / min(per_pos))]
             + ["%.2f" % p for p in per_step]
             + ["%.2f" % (max(per_step) / min(per_step)), "%.0f" % tok_s])
      o = None if original is None or m in PLAIN_TF else original.get("%s/%s" % (c, m))
      if original is not None and o is None:
        row += ["-"] * (4 if by_length else 3)
      elif original is not None:
        same = "-"
        if c == "greedy":
          same = str(bool(np.array_equal(np.asarray(o["ids"]),
                                         results["ids"][(c, m, compare_tokens)])))
        row += ["%.0f" % o["tok_s"], "%.2f" % (tok_s / o["tok_s"]), same]
        if by_length:
          orig_pos = [batch * 1000.0 / by_length[n]["%s/%s" % (c, m)]["tok_s"]
                      for n in new_tokens_list]
          row += ["%.2f" % (max(orig_pos) / min(orig_pos))]
      rows.append(row)
  return rows


def run(size, cases, meshes, new_tokens_list, compare_tokens, prompt_length, repeats,
        devices, original_python="", check_recompute=True, plain_tf=False,
        original_every_length=False):
  """Measures the port (and the original, when original_python exists; and plain TF,
  with plain_tf; the original at every length with original_every_length); returns
  (table rows, header first; greedy cached ids == recompute
  ids, or None; a line about the original's run; plain TF's greedy ids == the port's
  at every length, or None)."""
  with tempfile.TemporaryDirectory() as tmp:
    results = measure(size, cases, meshes, new_tokens_list, prompt_length, repeats,
                      devices, tmp, check_recompute, plain_tf)
    original, why = None, None
    if not original_python:
      why = "no --original_python"
    elif not os.path.exists(original_python):
      why = "%s is absent" % original_python
    else:
      lengths = new_tokens_list if original_every_length else [compare_tokens]
      by_length = {}
      for n in lengths:
        by_length[n], why = run_original(original_python, size, cases, meshes, n,
                                         prompt_length, repeats,
                                         results["checkpoints"][n])
        if by_length[n] is None:
          break
      else:
        original = by_length[compare_tokens]
        if original_every_length:
          original["_by_length"] = by_length
  if original is None:
    note = "original library: skipped (%s)" % why
  else:
    note = "original library: %s, %s new tokens, median of %d" % (
        original.pop("_machine", ""), ", ".join(map(str, sorted(
            original.get("_by_length", {compare_tokens: None})))), repeats)
  rows = table(size, cases, meshes, new_tokens_list, compare_tokens, results, original)
  return rows, results["recompute_same"], note, results["plain_same"]


def _pools_line(n_devices):
  """What this process's TF thread pools are."""
  from mesh_tf import cpu_threads  # pylint: disable=g-import-not-at-top
  if not FLAGS.size_thread_pools or n_devices < 2:
    return "TF's own thread pool sizes"
  return "pools sized for %d devices (%d thread(s) per op)" % (
      n_devices, cpu_threads.intra_op_threads())


def _measure_here(new_tokens_list, compare):
  """{"rows", "recompute_same", "original", "pools", "plain_same"} of every mesh of
  --meshes, measured in this process."""
  n_devices = max(MESHES[m][2] for m in FLAGS.meshes)
  devices = common.set_up_virtual_cpus(n_devices, FLAGS.size_thread_pools)
  rows, recompute_same, note, plain_same = run(
      FLAGS.size, FLAGS.cases, FLAGS.meshes, new_tokens_list, compare,
      FLAGS.prompt_length, FLAGS.repeats, devices, FLAGS.original_python,
      FLAGS.check_recompute, FLAGS.plain_tf, FLAGS.original_every_length)
  return dict(rows=rows, recompute_same=recompute_same, original=note,
              pools=_pools_line(n_devices), plain_same=plain_same)


# Flags a per-mesh process is given as they are (the lengths it is given resolved).
_PASSED_FLAGS = ("prompt_length", "repeats", "size", "cases", "original_python",
                 "size_thread_pools", "check_recompute", "plain_tf",
                 "original_every_length")


def _measure_per_process(new_tokens_list, compare):
  """_measure_here's result for every mesh, each measured by a process of its own (the
  thread pools the trainer's decode mode gives that mesh), rows merged."""
  merged = dict(rows=[], recompute_same=None, original=[], pools=[], plain_same=None)
  for m in FLAGS.meshes:
    with tempfile.TemporaryDirectory() as tmp:
      out = os.path.join(tmp, "mesh.json")
      argv = [sys.executable, "-m", "benchmarks.decode_speed", "--meshes=" + m,
              "--json_out=" + out, "--compare_tokens=%d" % compare,
              "--new_tokens=%s" % ",".join(map(str, new_tokens_list))]
      argv += ["--%s=%s" % (f, ",".join(v) if isinstance(v, list) else v)
               for f, v in ((f, getattr(FLAGS, f)) for f in _PASSED_FLAGS)]
      proc = subprocess.run(argv, cwd=os.path.dirname(os.path.dirname(
          os.path.abspath(__file__))), env=common.subprocess_env(), capture_output=True,
                            text=True, check=False)
      if proc.returncode:
        raise RuntimeError("decode_speed for mesh %s failed:\n%s" % (
            m, proc.stderr[-3000:]))
      with open(out) as f:
        got = json.load(f)
    merged["rows"] += got["rows"][0 if not merged["rows"] else 1:]
    for key in ("recompute_same", "plain_same"):
      if got[key] is not None:
        merged[key] = got[key]
    merged["original"].append("%s: %s" % (MESH_LABELS[m], got["original"]))
    merged["pools"].append("%s: %s" % (MESH_LABELS[m], got["pools"]))
  merged["original"] = "\n".join(merged["original"])
  merged["pools"] = "; ".join(merged["pools"])
  return merged


def main(_):
  tf.get_logger().setLevel("ERROR")  # the retracing warnings of one function per case
  new_tokens_list = [int(x) for x in FLAGS.new_tokens]
  if min(new_tokens_list) < 2:
    raise app.UsageError("--new_tokens must be 2 or more (1 is the fixed-cost baseline "
                         "of the ms/step columns)")
  compare = FLAGS.compare_tokens or new_tokens_list[len(new_tokens_list) // 2]
  if compare not in new_tokens_list:
    new_tokens_list.append(compare)
  for c in FLAGS.cases:
    if c not in CASES:
      raise app.UsageError("unknown case %r (%s)" % (c, ", ".join(CASES)))
  for m in FLAGS.meshes:
    if m not in MESHES:
      raise app.UsageError("unknown mesh %r (%s)" % (m, ", ".join(MESHES)))
  s = common.TRANSFORMER_SIZES[FLAGS.size]
  print(common.machine_line())
  print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
  if len(FLAGS.meshes) > 1 and not FLAGS.in_process:
    result = _measure_per_process(new_tokens_list, compare)
    where = "each mesh in a process of its own"
  else:
    result = _measure_here(new_tokens_list, compare)
    where = "in this process"
  sizes = {k: v for k, v in s.items() if k != "length"}
  print("cached decoding, Unitransformer LM (%s, size %s: %s), prompt %d tokens, "
        "length = max_length = prompt + new tokens; one tf.function per decode; median "
        "of %d decodes, every case and length alternating; %s (%s)" % (
            " + ".join(GIN_FILES), FLAGS.size, sizes, FLAGS.prompt_length,
            FLAGS.repeats, where, result["pools"]))
  print(result["original"])
  common.print_table(result["rows"])
  if result["recompute_same"] is not None:
    print("greedy cached ids == recompute ids (1 device, %d new tokens): %s" % (
        min(new_tokens_list), result["recompute_same"]))
  if result["plain_same"] is not None:
    print("plain TF greedy ids == mesh_tf's (1 device, every length): %s" % (
        result["plain_same"]))
  print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(result, f)
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
