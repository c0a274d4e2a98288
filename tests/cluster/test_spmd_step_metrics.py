"""step_metrics in the multi-client SPMD trainer: two processes (4 replicas each) on
mesh batch:2,model:4 report MFU and memory on their progress lines, each counts its
replicas' share of the model's FLOPs, and the chief writes the profile and scalars."""
import glob
import re

import lm_cluster_helpers
from models.transformer.trainer import summaries

# trainer_helpers.tiny_lm_bindings' LM (see tests/transformer/trainer/test_step_metrics.py):
# 6 x 128 tokens x (1 layer x (4*16*16 + 2*16*32 + 2*16*16) + 16*384 vocab).
TINY_LM_FLOPS = 6 * 128 * (4 * 16 * 16 + 2 * 16 * 32 + 2 * 16 * 16 + 16 * 384)


def test_spmd_peers_report_their_share_of_the_flops_and_the_chief_profiles(
    tmp_path, local_lm):
  model_dir = tmp_path / "spmd"
  params = lm_cluster_helpers.lm_params(model_dir, local_lm.corpus) + [
      "step_metrics.profile_steps = (2, 3)",
      "step_metrics.peak_flops_per_second = 1e9"]
  outs = lm_cluster_helpers.run_spmd(params, tmp_path)
  for out in outs:
    # every matmul of this layout is split 8 ways: a process's 4 replicas do half
    assert "%.4g FLOPs per step (matmuls, einsums and convolutions of the traced " \
           "step; 4 replicas)" % (TINY_LM_FLOPS / 2) in out, out[-3000:]
    assert re.search(r"^step 4/4 \[#{20}\] loss \S+ lr \S+ \d+ tokens/s \| MFU "
                     r"\d+\.\d% \| (max RSS|peak mem) \d+ MB", out, re.M), out[-3000:]
    assert re.search(r"^predicted step: compute \d+% / communication \d+% \(cost "
                     r"model", out, re.M)
  assert "profiling steps 2-3" in outs[0] and "profiling" not in outs[1]
  assert glob.glob(str(model_dir / "plugins" / "profile" / "*" / "*.xplane.pb"))
  scalars = summaries.read_scalars(str(model_dir))
  assert scalars["flops_per_step"][-1] == (4, TINY_LM_FLOPS / 2)
  assert 0 < scalars["mfu"][-1][1]
