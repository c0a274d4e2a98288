"""An SPMD run of the trainer stops at a non-finite loss as the single-client trainer
does: NonFiniteError naming the step and the last good checkpoint, in every peer.
(SIGTERM to one peer: test_spmd_trainer.py.)"""
import tensorflow as tf

import lm_cluster_helpers


def test_nonfinite_loss_stops_every_peer_naming_the_step_and_last_checkpoint(tmp_path):
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "spmd"
  # a rate that blows the weights up in one step: step 1's loss is finite, step 2's not
  params = lm_cluster_helpers.lm_params(model_dir, corpus, train_steps=3, save_every=1)
  params += ["utils.run.learning_rate_schedule = 1e12",
             "utils.run.mesh_shape = 'batch:2'"]  # one replica per process: quick
  with lm_cluster_helpers.spmd_peers(params, tmp_path) as procs:
    codes = lm_cluster_helpers.wait_all(procs, 240)
  outs = lm_cluster_helpers.peer_logs(tmp_path)
  assert all(code not in (0, None) for code in codes), outs
  for out in outs:
    assert "error: loss is nan at step 2; training stopped" in out, out[-3000:]
    assert "the last good checkpoint is %s-1" % (model_dir / "model.ckpt") in out
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("model.ckpt-1")
