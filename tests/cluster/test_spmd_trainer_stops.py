"""How an SPMD run of the trainer stops, as the single-client trainer does: SIGTERM to
one peer stops both after the same step with a checkpoint and status 143; a non-finite
loss raises NonFiniteError naming the step and the last good checkpoint in every peer."""
import signal

import tensorflow as tf

import lm_cluster_helpers


def test_sigterm_to_one_peer_stops_both_after_the_same_step_with_a_checkpoint(tmp_path):
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "spmd"
  params = lm_cluster_helpers.lm_params(model_dir, corpus, train_steps=1000,
                                        save_every=1000)
  with lm_cluster_helpers.spmd_peers(params, tmp_path) as procs:
    lm_cluster_helpers.wait_for_text(tmp_path / "peer1.txt", "step 1/1000", procs, 240)
    procs[1].send_signal(signal.SIGTERM)  # the chief gets no signal
    codes = lm_cluster_helpers.wait_all(procs, 120)
  outs = lm_cluster_helpers.peer_logs(tmp_path)
  assert codes == [128 + signal.SIGTERM] * 2, outs
  stopped = [line for out in outs for line in out.splitlines()
             if line.startswith("stopped at step")]
  assert len(stopped) == 2 and stopped[0] == stopped[1], outs
  step = int(stopped[0].split()[3])
  assert 1 <= step < 1000
  assert stopped[0].endswith("by SIGTERM; resume by running the same command again")
  assert "saved checkpoint %s-%d" % (model_dir / "model.ckpt", step) in outs[0]
  reader = tf.train.load_checkpoint(str(model_dir))
  assert int(reader.get_tensor("global_step")) == step


def test_nonfinite_loss_stops_every_peer_naming_the_step_and_last_checkpoint(tmp_path):
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "spmd"
  # a rate that blows the weights up in one step: step 1's loss is finite, step 2's not
  params = lm_cluster_helpers.lm_params(model_dir, corpus, train_steps=3, save_every=1)
  params.append("utils.run.learning_rate_schedule = 1e12")
  with lm_cluster_helpers.spmd_peers(params, tmp_path) as procs:
    codes = lm_cluster_helpers.wait_all(procs, 240)
  outs = lm_cluster_helpers.peer_logs(tmp_path)
  assert all(code not in (0, None) for code in codes), outs
  for out in outs:
    assert "error: loss is nan at step 2; training stopped" in out, out[-3000:]
    assert "the last good checkpoint is %s-1" % (model_dir / "model.ckpt") in out
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("model.ckpt-1")
