"""The benchmark scripts run end to end (tiny sizes, one step) and print their tables.

Only what they print is checked, never how fast anything was.
"""
import os
import re
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


def test_layouts_prints_emitted_and_predicted_bytes():
  out = _run("benchmarks.layouts", "--size=tiny", "--steps=1", "--repeats=1",
             "--backends=placement,simd", "--devices=4")
  rows = [line.split() for line in out.splitlines() if line.startswith(("placement ",
                                                                         "simd "))]
  assert len(rows) == 8
  for row in rows:
    assert row[4] == row[5], row  # emitted bytes == cost model bytes


def test_simd_scaling_prints_equal_op_counts():
  # the LM at length 8 and toy widths: the table's code path (and one op count at every
  # mesh) at a fraction of the full LM's step
  out = _run("benchmarks.simd_scaling", "--steps=1", "--repeats=1", "--lm_length=8",
             "--lm_vocab=64", "--lm_d_model=32", "--lm_d_ff=64")
  counts = [line.split()[3] for line in out.splitlines()
            if line.split() and line.split()[0] in ("8", "64", "512")]
  assert len(counts) == 3 and len(set(counts)) == 1, out
  lm_rows = [line.split() for line in out.splitlines() if line.startswith("lm-simd")]
  assert [row[1] for row in lm_rows] == ["8", "64", "512"], out
  assert len({row[5] for row in lm_rows}) == 1, out  # tf_ops
  assert len({row[9] for row in lm_rows}) == 1, out  # first_loss
  assert "length 8" in out and "reference skipped" in out, out


def test_step_time_prints_every_variant_with_equal_first_losses():
  out = _run("benchmarks.step_time", "--steps=1", "--repeats=1", "--build_repeats=1",
             "--batch=8", "--length=8", "--vocab=32", "--d_model=16", "--d_ff=32",
             "--heads=8", "--d_kv=4", "--num_layers=1", "--devices=4")
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


def test_remat_bf16_prints_equal_losses_and_ratios():
  out = _run("benchmarks.remat_bf16", "--size=tiny", "--steps=1", "--repeats=1",
             "--backends=placement", "--bf16_model=2")
  remat = [l.split() for l in out.splitlines() if l.startswith("placement ")]
  assert len(remat) == 4, out  # one remat row, three bf16 rows
  assert remat[0][-1] == remat[0][-2], out  # recompute_grads changes no loss
  assert 0 < float(remat[0][3]) < 2, out  # an activation-memory ratio was measured
  first_losses = [float(r[-1]) for r in remat[1:]]
  assert max(first_losses) - min(first_losses) < 0.05 * first_losses[0], out


def test_sharded_state_prints_bytes_per_device_divided_by_the_dp_degree():
  out = _run("benchmarks.sharded_state", "--size=tiny", "--steps=2", "--layouts=dp+mp",
             "--devices=4")
  rows = {(r[0], r[2]): r for r in (l.split() for l in out.splitlines())
          if len(r) == 8 and r[1] == "dp+mp"}
  for opt in ("adam", "adafactor"):
    full, split = rows[(opt, "False")], rows[(opt, "True")]
    assert full[3] == full[4] and split[3] == split[4], out  # bytes == prediction
    assert int(full[3]) == 2 * int(split[3]), out  # batch:2 splits the state in two
    assert float(split[7]) < 1e-5, out  # the same losses


def test_multi_process_prints_a_row_per_thread_sizing_with_equal_losses():
  """Two SPMD processes and a placement cluster against one process, with the processes
  sizing their thread pools (the suite's TF_NUM_INTRAOP_THREADS removed) and with TF's
  own sizing; every row with the CPU time of its processes."""
  env = {k: v for k, v in os.environ.items() if k != "TF_NUM_INTRAOP_THREADS"}
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.multi_process", "--size=tiny", "--configs=2x4",
       "--modes=local,spmd,placement", "--threads=auto,0", "--steps=1", "--repeats=1"],
      capture_output=True, text=True, timeout=600, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {" ".join(line.split()[:3]): line.split()
          for line in result.stdout.splitlines()
          if line.startswith(("local ", "spmd ", "placement "))}
  assert sorted(rows) == ["local 1x8 threads=0", "local 1x8 threads=auto",
                          "placement 2x4 threads=0", "placement 2x4 threads=auto",
                          "spmd 2x4 threads=0", "spmd 2x4 threads=auto"], result.stdout
  assert len({row[-1] for row in rows.values()}) == 1, result.stdout  # one loss
  assert rows["spmd 2x4 threads=auto"][-3] == rows["spmd 2x4 threads=0"][-3] != "0"
  assert all(float(row[-4]) > 0 for row in rows.values())  # CPU ms per step


def test_collective_latency_prints_every_row_with_its_extra_time():
  """Two processes check their sums (the run fails otherwise) and time each row."""
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.collective_latency", "--calls=2", "--repeats=1",
       "--matmuls=1", "--floats=3"], capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {}
  for line in result.stdout.splitlines():
    cells = re.split(r"\s{2,}", line.strip())  # the table's columns
    if cells[0] in ("call", "1 reduce", "2 chained", "2 side by side", "compute",
                    "compute + 1 reduce"):
      rows[cells[0]] = cells[1:]
  assert len(rows) == 6, result.stdout
  assert all(float(r[0]) > 0 for r in rows.values())
  assert rows["1 reduce"][2] == "call" and rows["compute + 1 reduce"][2] == "compute"
  assert "3 float(s)" in result.stdout


def test_decode_speed_measures_each_mesh_in_a_process_with_the_trainers_pools():
  out = _run("benchmarks.decode_speed", "--size=tiny", "--meshes=1,2x2", "--cases=greedy",
             "--new_tokens=4,8", "--repeats=1", "--original_python=")
  assert ("each mesh in a process of its own (1 device: TF's own thread pool sizes; "
          "2x2 dp+mp: pools sized for 4 devices (1 thread(s) per op))") in out, out
  rows = [line.split() for line in out.splitlines()
          if line.startswith("greedy ") and "==" not in line]
  labels = [" ".join(r[1:-7]) for r in rows]
  assert labels == ["1 device", "1 device, plain TF, static attention",
                    "1 device, plain TF, prefix attention", "2x2 dp+mp"], out
  assert all(float(r[-7]) > 0 and float(r[-6]) > 0 for r in rows), out
  assert "greedy cached ids == recompute ids (1 device, 4 new tokens): True" in out
  # the hand-written plain TF decoder computes what mesh_tf's does, on its checkpoint
  assert "plain TF greedy ids == mesh_tf's (1 device, every length): True" in out, out
  assert out.count("original library: skipped (no --original_python)") == 2, out
