"""Noticing a lost SPMD peer without a thread per collective.

A TF collective given `timeout_seconds` keeps one OS thread asleep for the whole
timeout, so a step of many collectives piles up thousands of threads. The replicas'
collectives therefore wait without a timeout, and this monitor health-checks every peer
instead: when one does not answer within `timeout`, it aborts this process's
collectives, so the step in flight fails, and remembers which task it was.
"""
import threading

import tensorflow as tf
from tensorflow.python.eager import context

from mesh_tf.cluster import spec


def task_name(task):
  """The TF task string of task `task` of the cluster's job."""
  return "/job:%s/replica:0/task:%d" % (spec.JOB, task)


def check_peer(task, timeout):
  """None if task answers a health check within timeout seconds, else the reason."""
  try:
    context.context().check_collective_ops_peer_health(task_name(task),
                                                       max(1, int(timeout * 1000)))
    return None
  except tf.errors.OpError as e:
    lines = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, lines[0][:160] if lines else "")


class PeerMonitor:
  """A daemon thread checking every other task of `addresses` every `interval` s.

  `lost` is (task, address, reason) once a peer failed to answer within `timeout`
  seconds; this process's collectives are then aborted (they fail at once).
  """

  def __init__(self, addresses, task, timeout, interval=None):
    self.addresses = list(addresses)
    self.task = task
    self.timeout = float(timeout)
    self.interval = interval if interval is not None else min(2.0, self.timeout / 4)
    self.lost = None
    self._stop = threading.Event()
    self._thread = None

  def start(self):
    """Starts checking (once every peer is known to be up)."""
    if self._thread is None and self.timeout > 0:
      self._thread = threading.Thread(target=self._watch, daemon=True,
                                      name="mesh_tf-peer-monitor")
      self._thread.start()

  def stop(self):
    """Stops checking (the run is over)."""
    self._stop.set()

  def _watch(self):
    while not self._stop.wait(self.interval):
      for peer in range(len(self.addresses)):
        if peer == self.task or self._stop.is_set():
          continue
        reason = check_peer(peer, self.timeout)
        if reason is not None and not self._stop.is_set():
          self.lost = (peer, self.addresses[peer], reason)
          context.context().abort_collective_ops(
              tf.errors.UNAVAILABLE, "peer task %d (%s) lost: %s"
              % (peer, self.addresses[peer], reason))
          return

  def lost_error(self):
    """A ClusterError naming the lost peer, or None."""
    if self.lost is None:
      return None
    peer, address, reason = self.lost
    return spec.ClusterError(
        "lost worker task %d (%s): it did not answer a health check within %.0f s "
        "(killed, stopped or unreachable; %s); restart every process with the same "
        "command to resume from the last checkpoint" % (peer, address, self.timeout,
                                                        reason), task=peer)
