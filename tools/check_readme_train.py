"""Checks that `make train` prints the lines the README quotes (claims equal facts).

    python tools/check_readme_train.py            # runs `make train` in a fresh model dir
    python tools/check_readme_train.py LOG_FILE   # checks a saved `make train` output

The README's block after "prints the same numbers" lists eval lines and decodes of the
seeded run, and its trainer section the FLOPs per step `make train` counts; every one of
them must appear in the output. Exits 1 naming the lines missing.
Run by hand before a release (about a minute on 2 cores), not by the test suite.
"""
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"prints\s+the\s+same\s+numbers")


def quoted_lines(readme_text):
  """The lines of the first fenced block after MARKER."""
  rest = readme_text[MARKER.search(readme_text).start():]
  start = rest.index("```\n") + 4
  return [line for line in rest[start:rest.index("```", start)].splitlines() if line.strip()]


def train_output():
  """What `make train` prints from a model directory nobody has trained in."""
  with tempfile.TemporaryDirectory(prefix="readme_lm_") as model_dir:
    result = subprocess.run(["make", "-s", "train", "MODEL_DIR=" + model_dir], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  if result.returncode:
    sys.exit("make train failed (exit %d):\n%s" % (result.returncode, result.stdout[-3000:]))
  return result.stdout


def main(argv):
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  expected = quoted_lines(readme) + [
      "%s FLOPs per step" % m for m in re.findall(r"`(\S+) FLOPs per\s+step`", readme)]
  if len(argv) > 1:
    with open(argv[1]) as f:
      output = f.read()
  else:
    output = train_output()
  missing = [line for line in expected if line not in output]
  printed = [line for line in output.splitlines() if line.startswith(("eval at", "'"))]
  if missing:
    print("README lines that `make train` did not print:\n  " + "\n  ".join(missing))
    print("it printed:\n  " + "\n  ".join(printed))
    return 1
  print("all %d README lines were printed by make train" % len(expected))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
