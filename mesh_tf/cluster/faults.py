"""Turning a lost worker into one clear error instead of a stack of gRPC failures.

When a worker dies, TF's runtime fails the step in flight (or the next one) with an
UNAVAILABLE / ABORTED / CANCELLED error from some remote device. `lost_tasks` asks every
worker whether it still answers, and `raise_lost_task` re-raises such a failure as a
ClusterError naming the tasks that are gone.
"""
import contextlib
import re
import socket

import tensorflow as tf

from mesh_tf.cluster import spec

# Errors TF raises when a peer process went away mid-step.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                tf.errors.CancelledError, tf.errors.DeadlineExceededError,
                tf.errors.InternalError, tf.errors.UnknownError)
PROBE_TIMEOUT = 2.0


def _answers(address, timeout):
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
      return True
  except OSError:
    return False


def lost_tasks(addresses, timeout=PROBE_TIMEOUT):
  """Indices of the workers that do not accept a connection within timeout seconds."""
  return [t for t, a in enumerate(addresses) if not _answers(a, timeout)]


def tasks_named_in(message):
  """Task indices of job "worker" mentioned in an error message."""
  return sorted({int(t) for t in re.findall(r"/job:%s/replica:\d+/task:(\d+)" % spec.JOB,
                                            message)})


def lost_task_error(error, addresses, timeout=PROBE_TIMEOUT, has_checkpoint=None):
  """A ClusterError naming the lost tasks if `error` came from a worker that is gone,
  else None. has_checkpoint: a callable saying whether a checkpoint exists to resume
  from (None: assume one does)."""
  if not isinstance(error, _PEER_ERRORS):
    return None
  lost = lost_tasks(addresses, timeout)
  if not lost:
    return None
  first = str(error).strip().splitlines()
  detail = next((line.strip() for line in first if "UNAVAILABLE" in line or
                 "Connection" in line), first[0] if first else type(error).__name__)
  return spec.ClusterError(
      "lost worker task %s (%s): %s; restart it and run the same command again %s"
      % (",".join(str(t) for t in lost), ",".join(addresses[t] for t in lost),
         detail[:200], "to resume from the last checkpoint"
         if has_checkpoint is None or has_checkpoint() else
         "(no checkpoint was written yet, so training starts from step 0)"),
      task=lost[0])


@contextlib.contextmanager
def raise_lost_task(addresses, timeout=PROBE_TIMEOUT, has_checkpoint=None):
  """Within the block, a TF error caused by a dead worker becomes a ClusterError."""
  try:
    yield
  except _PEER_ERRORS as e:
    lost = lost_task_error(e, addresses, timeout, has_checkpoint)
    if lost is None:
      raise
    raise lost from e
