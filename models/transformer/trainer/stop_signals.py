"""`GracefulStop`: SIGTERM / Ctrl-C end training after the current step, with a checkpoint.

The first SIGINT or SIGTERM only records the signal; the train loop saves and calls
`exit()`. A second signal aborts at once (saves are atomic). Outside the main thread
(where Python cannot take signals) the context does nothing.
"""
import signal
import sys
import threading

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
  """Context manager deferring SIGINT/SIGTERM to the train loop's next step boundary."""

  def __init__(self):
    self.signum = None
    self._previous = {}

  @property
  def requested(self):
    return self.signum is not None

  def _handle(self, signum, unused_frame):
    if self.signum is not None:  # the second signal: stop now
      sys.stderr.write("\n%s again: aborting now\n" % signal.Signals(signum).name)
      signal.signal(signum, signal.SIG_DFL)
      if signum == signal.SIGINT:
        raise KeyboardInterrupt
      signal.raise_signal(signum)
      return
    self.signum = signum
    sys.stderr.write("\n%s: finishing this step and saving a checkpoint (send it again "
                     "to abort at once)\n" % signal.Signals(signum).name)

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in _SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *unused):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def exit(self, message):
    """Prints message and ends the run as the signal asked: KeyboardInterrupt for
    SIGINT (exit status 130 from the command line), SystemExit(143) for SIGTERM."""
    print(message, flush=True)
    if self.signum == signal.SIGINT:
      raise KeyboardInterrupt(message)
    raise SystemExit(128 + self.signum)
