"""A train data file deleted mid-run: the trainer saves the steps it completed, then
stops with one line naming the file and that checkpoint."""
import os
import re
import subprocess
import threading

import tensorflow as tf

import trainer_helpers
from mesh_tf.checkpoint import discovery, step_from_prefix


def test_deleted_data_file_saves_and_names_file_and_checkpoint(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = str(tmp_path / "model")
  # No periodic save within the run: any checkpoint is the one the data error saves.
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=100000,
                                            save_every=100000, keep=2, log_every=1)
  proc = trainer_helpers.start_main(params, text=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
  watchdog = threading.Timer(240, proc.kill)  # the line loop below waits on the trainer
  watchdog.start()
  try:
    seen = []
    for line in proc.stdout:  # ends when the trainer exits
      seen.append(line)
      if re.match(r"step \d+/100000 ", line):
        os.remove(corpus)
        break
    assert not os.path.exists(corpus), "trainer printed no step line:\n" + "".join(seen)
    out, err = proc.communicate(timeout=180)
  finally:
    watchdog.cancel()
    proc.kill()
    proc.wait()
  out = "".join(seen) + out
  assert proc.returncode not in (0, None), out[-2000:]
  steps = [int(s) for s in re.findall(r"^step (\d+)/", out, re.M)]
  error = [l for l in err.splitlines() if l.startswith("error: ")]
  assert len(error) == 1, err[-3000:]
  match = re.search(r"after step (\d+): data file (\S+): No such file or directory; "
                    r".*the last good checkpoint is (\S+model\.ckpt-(\d+))", error[0])
  assert match, error[0]
  stopped, named_file, named, named_step = (int(match.group(1)), match.group(2),
                                            match.group(3), int(match.group(4)))
  assert named_file == corpus
  assert named_step == stopped >= max(steps)
  latest = discovery.find_checkpoints(model_dir).checkpoints
  assert latest and latest[-1] == named
  reader = tf.train.load_checkpoint(named)
  assert int(reader.get_tensor("global_step")) == stopped == step_from_prefix(named)
  assert "saved checkpoint %s" % named in out
