"""A progress line for training: step/total, a bar, loss, learning rate, tokens/s, then
(with step_metrics) MFU and peak memory, and the ETA."""
import sys
import time


def format_duration(seconds):
  """Seconds as H:MM:SS."""
  seconds = max(0, int(round(seconds)))
  return "%d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)


class Progress:
  """Measures throughput since start() and prints one line per report() to stream
  (stdout by default). metrics, a step_metrics.StepMetrics, adds MFU and memory; after
  each report `scalars` holds its values for TensorBoard."""

  def __init__(self, total_steps, tokens_per_step, stream=None, bar_width=20,
               metrics=None):
    self.total_steps = total_steps
    self.tokens_per_step = tokens_per_step
    self.stream = stream or sys.stdout
    self.bar_width = bar_width
    self.metrics = metrics
    self.scalars = {}
    self._start_time = self._last_time = None
    self._start_step = self._last_step = 0

  def start(self, step):
    """Begins timing at global step `step` (e.g. the resumed step)."""
    self._start_time = self._last_time = time.time()
    self._start_step = self._last_step = step

  def report(self, step, loss, learning_rate):
    """Prints the line for global step `step`; returns the tokens/s since last report."""
    now = time.time()
    steps = step - self._last_step
    elapsed = max(now - self._last_time, 1e-9)
    tokens_per_second = steps * self.tokens_per_step / elapsed
    per_step = (now - self._start_time) / max(step - self._start_step, 1)
    eta = per_step * (self.total_steps - step)
    done = int(self.bar_width * step / max(self.total_steps, 1))
    bar = "#" * done + "." * (self.bar_width - done)
    extra = ""
    if self.metrics is not None:
      extra, self.scalars = self.metrics.measure(steps / elapsed)
      extra = " | %s |" % extra
    self.stream.write("step %d/%d [%s] loss %.4f lr %.3g %.0f tokens/s%s ETA %s\n"
                      % (step, self.total_steps, bar, loss, learning_rate,
                         tokens_per_second, extra, format_duration(eta)))
    self.stream.flush()
    self._last_time, self._last_step = now, step
    return tokens_per_second
