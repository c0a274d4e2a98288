"""The benchmark scripts run end to end (tiny sizes, one step) and print their tables.

Only what they print is checked, never how fast anything was.
"""
import subprocess
import sys



def _run(*args):
  result = subprocess.run([sys.executable, "-m"] + list(args), capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_overhead_prints_ratios_to_plain_tf_and_equal_losses():
  out = _run("benchmarks.overhead", "--size=tiny", "--steps=1", "--repeats=1")
  for variant in ("plain TF, no-xla", "mesh_tf, no-xla", "plain TF, xla", "mesh_tf, xla"):
    assert variant in out
  assert "ratio to plain TF" in out
  # After the same steps from the same weights, both sides report the same loss.
  losses = [line.split(":")[1].replace("mesh_tf", "").replace("plain TF", "").split(",")
            for line in out.splitlines() if line.startswith("loss after 2 steps")]
  assert len(losses) == 2, out
  for mtf_loss, tf_loss in losses:
    assert abs(float(mtf_loss) - float(tf_loss)) < 1e-4, out


def test_layouts_prints_measured_and_predicted_bytes():
  out = _run("benchmarks.layouts", "--size=tiny", "--steps=1", "--repeats=1",
             "--backends=placement,simd")
  rows = [line.split() for line in out.splitlines() if line.startswith(("placement ",
                                                                         "simd "))]
  assert len(rows) == 8
  for row in rows:
    assert row[4] == row[5], row  # measured bytes == cost model bytes


def test_simd_scaling_prints_equal_op_counts():
  out = _run("benchmarks.simd_scaling", "--steps=1", "--repeats=1")
  counts = [line.split()[3] for line in out.splitlines()
            if line.split() and line.split()[0] in ("8", "64", "512")]
  assert len(counts) == 3 and len(set(counts)) == 1, out
