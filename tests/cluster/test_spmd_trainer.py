"""The trainer (`python -m models.transformer.main`) in multi-client SPMD mode: two
processes (4 virtual CPUs each) train the `make train` LM on mesh batch:2,model:4, each
from TF_CONFIG, each reading its own rows of the batch; compared with one process."""
import numpy as np

import lm_cluster_helpers

run_spmd = lm_cluster_helpers.run_spmd


def test_make_train_lm_in_spmd_matches_one_process_and_restores_anywhere(tmp_path):
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  spmd_dir, local_dir = tmp_path / "spmd", tmp_path / "local"
  outs = run_spmd(lm_cluster_helpers.lm_params(spmd_dir, corpus) +
                  ["utils.run.keep_checkpoint_max = 1"], tmp_path)
  assert "rows [0, 4) of each batch" in outs[0] and "rows [4, 8) of each batch" in outs[1]
  assert "saved checkpoint" in outs[0] and "saved checkpoint" not in outs[1]
  for out in outs:  # the single-client trainer's progress lines
    assert "step 4/4 [####################] loss " in out, out[-3000:]
  # keep_checkpoint_max = 1: the chief pruned step 2's checkpoint after writing step 4's
  assert sorted(p.name for p in spmd_dir.glob("model.ckpt-*.index")) == [
      "model.ckpt-4.index"]
  history = lm_cluster_helpers.run_here(lm_cluster_helpers.lm_params(local_dir, corpus))
  spmd_losses = lm_cluster_helpers.losses_of(spmd_dir)
  assert [s for s, _ in spmd_losses] == [1, 2, 3, 4]
  np.testing.assert_allclose([l for _, l in spmd_losses], [l for _, l in history],
                             rtol=1e-5)
  lm_cluster_helpers.assert_same_weights(
      lm_cluster_helpers.checkpoint_weights(spmd_dir),
      lm_cluster_helpers.checkpoint_weights(local_dir))
  evals = [lm_cluster_helpers.run_here(
      lm_cluster_helpers.lm_params(spmd_dir, corpus),
      ["utils.run.mode = 'eval'", "utils.run.mesh_shape = %r" % mesh,
       "utils.run.layout_rules = %r" % layout])
           for mesh, layout in (("", ""), ("batch:2,model:4", "batch:batch,d_ff:model,"
                                            "heads:model,vocab:model"))]
  assert evals[0]["step"] == evals[1]["step"] == 4
  np.testing.assert_allclose(evals[0]["loss"], evals[1]["loss"], rtol=1e-5)


def test_step_through_multi_worker_mirrored_strategy_run_matches_one_process(tmp_path):
  # one replica per process: mesh batch:2 over the two processes, each step through
  # MultiWorkerMirroredStrategy.run
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  spmd_dir, local_dir = tmp_path / "spmd", tmp_path / "local"
  strategy = ["utils.run.mesh_shape = 'batch:2'", "utils.run.train_steps = 2",
              "cluster_setup.cluster_config.distribution = 'multi_worker_mirrored'"]
  outs = run_spmd(lm_cluster_helpers.lm_params(spmd_dir, corpus) + strategy, tmp_path)
  assert "steps through strategy.run of MultiWorkerMirroredStrategy" in outs[0]
  assert "rows [0, 4) of each batch" in outs[0] and "rows [4, 8) of each batch" in outs[1]
  history = lm_cluster_helpers.run_here(lm_cluster_helpers.lm_params(
      local_dir, corpus, train_steps=2))
  np.testing.assert_allclose([l for _, l in lm_cluster_helpers.losses_of(spmd_dir)],
                             [l for _, l in history], rtol=1e-5)
  lm_cluster_helpers.assert_same_weights(
      lm_cluster_helpers.checkpoint_weights(spmd_dir),
      lm_cluster_helpers.checkpoint_weights(local_dir))
