"""benchmarks/decode.py runs end to end at a tiny size (as tests/test_benchmarks_run.py
does for the other benchmarks): it prints a tokens/s row per length, and both decoding
paths produce the same ids. How fast anything was is never checked."""
import subprocess
import sys


def test_decode_benchmark_prints_rates_and_equal_ids():
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.decode", "--size=tiny", "--new_tokens=2,4",
       "--repeats=1"], capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  rows = [line.split() for line in out.splitlines()
          if line.split() and line.split()[0] in ("2", "4")]
  assert len(rows) == 2, out
  for row in rows:
    assert row[-1] == "True", out  # the cached and recompute paths decoded the same ids
    assert float(row[1]) > 0 and float(row[2]) > 0, out
