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


def test_step_time_prints_every_variant_with_equal_first_losses():
  out = _run("benchmarks.step_time", "--steps=1", "--repeats=1", "--build_repeats=2",
             "--batch=8", "--length=8", "--vocab=32", "--d_model=16", "--d_ff=32")
  rows = [line.split() for line in out.splitlines()
          if line.startswith(("plain TF ", "DTensor ", "mesh_tf "))]
  # columns after the label: s/step, ratio, TF ops, build s, first call s, first loss
  labels = [" ".join(r[:-6]) for r in rows]
  assert labels == ["plain TF single", "plain TF single XLA", "DTensor dp", "DTensor mp",
                    "DTensor dp+mp"] + [
                        "mesh_tf %s %s" % (b, l) for b in ("placement", "simd")
                        for l in ("single", "dp", "mp", "dp+mp")], out
  assert rows[0][-5] == "1.00"  # the baseline's ratio to itself
  # Same weights and data: every variant's loss before its first update is plain TF's.
  for row in rows:
    assert int(row[-4]) > 0 and float(row[-3]) > 0 and float(row[-2]) > 0
    assert abs(float(row[-1]) - float(rows[0][-1])) < 1e-4, row
