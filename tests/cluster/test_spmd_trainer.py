"""The trainer (`python -m models.transformer.main`) in multi-client SPMD mode: two
processes (4 virtual CPUs each) train the `make train` LM on mesh batch:2,model:4, each
from TF_CONFIG, each reading its own rows of the batch; compared with one process.
The same command to more steps resumes, and SIGTERM to one peer stops both. The first
run also checks step_metrics in this mode: each peer reports MFU and memory, counts its
replicas' share of the model's FLOPs, and the chief alone writes the profile. (Steps
through MultiWorkerMirroredStrategy.run: test_spmd_exact_resume.py.)"""
import glob
import re
import signal

import numpy as np

import lm_cluster_helpers
from mesh_tf.checkpoint import files
from models.transformer.trainer import summaries

run_spmd = lm_cluster_helpers.run_spmd

# trainer_helpers.tiny_lm_bindings' LM (see tests/transformer/trainer/test_step_metrics.py):
# 6 x 128 tokens x (1 layer x (4*16*16 + 2*16*32 + 2*16*16) + 16*384 vocab).
TINY_LM_FLOPS = 6 * 128 * (4 * 16 * 16 + 2 * 16 * 32 + 2 * 16 * 16 + 16 * 384)
PROFILE = ["step_metrics.profile_steps = (2, 3)", "step_metrics.peak_flops_per_second = 1e9"]


def _assert_step_metrics(outs, model_dir):
  """Each peer's FLOPs line counts its 4 processors' half of the model (every matmul of
  batch:2,model:4 is split 8 ways); progress lines carry MFU and memory; only the chief
  profiles steps 2-3 and writes the FLOPs and MFU scalars."""
  for out in outs:
    assert "%.4g FLOPs per step (matmuls, einsums and convolutions of the traced " \
           "step; 4 processors in one program)" % (TINY_LM_FLOPS / 2) in out, out[-3000:]
    assert re.search(r"^step 4/4 \[#{20}\] loss \S+ lr \S+ \d+ tokens/s \| MFU "
                     r"\d+\.\d% \| (max RSS|peak mem) \d+ MB", out, re.M), out[-3000:]
    assert re.search(r"^predicted step: compute \d+% / communication \d+% \(cost "
                     r"model", out, re.M)
  assert "profiling steps 2-3" in outs[0] and "profiling" not in outs[1]
  assert glob.glob(str(model_dir / "plugins" / "profile" / "*" / "*.xplane.pb"))
  scalars = summaries.read_scalars(str(model_dir))
  assert scalars["flops_per_step"][-1] == (4, TINY_LM_FLOPS / 2)
  assert 0 < scalars["mfu"][-1][1]


def _stop_by_sigterm_to_peer_1(params, log_dir):
  """Starts the peers (resuming at step 4), sends SIGTERM to task 1 only as it starts
  training; returns the step both stopped at (asserting the single-client trainer's
  stop: status 143, the same message, a checkpoint of that step from the chief)."""
  with lm_cluster_helpers.spmd_peers(params, log_dir) as procs:
    # the first step takes seconds to trace: the signal arrives before its end
    lm_cluster_helpers.wait_for_text(log_dir / "peer1.txt", "training Unitransformer",
                                     procs, 240)
    procs[1].send_signal(signal.SIGTERM)  # the chief gets no signal
    codes = lm_cluster_helpers.wait_all(procs, 120)
  outs = lm_cluster_helpers.peer_logs(log_dir)
  assert codes == [128 + signal.SIGTERM] * 2, [o[-2000:] for o in outs]
  for out in outs:
    assert "resumed from %s-4 at step 4" % params_model_dir(params) in out, out[-3000:]
  stopped = [re.findall(r"^stopped at step (\d+) by SIGTERM; resume by running the "
                        r"same command again$", out, re.M) for out in outs]
  assert len(stopped[0]) == 1 and stopped[0] == stopped[1], outs
  step = int(stopped[0][0])
  assert "saved checkpoint %s-%d\n" % (params_model_dir(params), step) in outs[0]
  assert "saved checkpoint" not in outs[1]
  return step


def _metrics(path):
  """The numbers of an eval_results file, in its order."""
  return [float(line.split(" = ")[1]) for line in path.read_text().splitlines()]


def params_model_dir(params):
  """The model.ckpt prefix of the model_dir bound in params."""
  bound = [p for p in params if p.startswith("utils.run.model_dir = ")][0]
  return bound.split(" = ")[1].strip("'") + "/model.ckpt"


def test_make_train_lm_in_spmd_matches_one_process_and_restores_anywhere(tmp_path,
                                                                          local_lm):
  spmd_dir = tmp_path / "spmd"
  params = lm_cluster_helpers.lm_params(spmd_dir, local_lm.corpus) + [
      "utils.run.keep_checkpoint_max = 1"]
  outs = run_spmd(params + [lm_cluster_helpers.EVAL_DURING_TRAINING] + PROFILE, tmp_path)
  _assert_step_metrics(outs, spmd_dir)
  assert "rows [0, 4) of each batch" in outs[0] and "rows [4, 8) of each batch" in outs[1]
  assert "saved checkpoint" in outs[0] and "saved checkpoint" not in outs[1]
  for out in outs:  # the single-client trainer's progress lines
    assert "step 4/4 [####################] loss " in out, out[-3000:]
  # keep_checkpoint_max = 1: the chief pruned step 2's checkpoint after writing step 4's
  assert sorted(p.name for p in spmd_dir.glob("model.ckpt-*.index")) == [
      "model.ckpt-4.index"]
  spmd_losses = lm_cluster_helpers.losses_of(spmd_dir)
  assert [s for s, _ in spmd_losses] == [1, 2, 3, 4]
  np.testing.assert_allclose([l for _, l in spmd_losses], local_lm.losses(), rtol=1e-5)
  lm_cluster_helpers.assert_same_weights(
      lm_cluster_helpers.checkpoint_weights(spmd_dir), local_lm.weights())
  for step in (2, 4):  # eval during training, each process on its rows: as one process
    assert "eval at step %d: loss " % step in outs[1]
    np.testing.assert_allclose(
        _metrics(spmd_dir / "eval" / ("eval_results-%d.txt" % step)),
        _metrics(local_lm.model_dir / "eval" / ("eval_results-%d.txt" % step)),
        rtol=1e-5)
  # to step 1000 on mesh batch:2 (one replica per process, fewer to trace): it resumes
  # the [2,4] checkpoint at step 4, and SIGTERM to one peer stops both after one step
  (tmp_path / "stop").mkdir()
  # a garbled state file: every process (not only the chief) must find step 4 by scanning
  (spmd_dir / files.STATE_FILENAME).write_text("garbage \x00 not a state file")
  stopped_at = _stop_by_sigterm_to_peer_1(
      params + ["utils.run.train_steps = 1000", "utils.run.mesh_shape = 'batch:2'"],
      tmp_path / "stop")
  assert 4 < stopped_at < 1000
  assert sorted(p.name for p in spmd_dir.glob("model.ckpt-*.index")) == [
      "model.ckpt-%d.index" % stopped_at]
  evals = [lm_cluster_helpers.run_here(
      lm_cluster_helpers.lm_params(spmd_dir, local_lm.corpus),
      ["utils.run.mode = 'eval'", "utils.run.mesh_shape = %r" % mesh,
       "utils.run.layout_rules = %r" % layout])
           for mesh, layout in (("", ""), ("batch:2,model:4", "batch:batch,d_ff:model,"
                                            "heads:model,vocab:model"))]
  assert evals[0]["step"] == evals[1]["step"] == stopped_at
  np.testing.assert_allclose(evals[0]["loss"], evals[1]["loss"], rtol=1e-5)
