"""Before step 1 of an SPMD run, every process checks that it runs the same run as the
chief: processes that disagree (another learning rate, another checkpoint, another
layout) would otherwise train together silently wrong, or fail deep inside TF with a
collective shape mismatch.

Each process describes its run as {setting: value text}; every description is sent to
all (small collectives with their own group key, whatever the mesh), and all of them
compute the same first difference and stop with the same line.
"""
import json

import numpy as np
import tensorflow as tf

from mesh_tf.cluster import spec

# Clear of the mesh groups (mesh_tf.backends.simd_multi_client.GROUP_KEY_BASE and up)
# and of tf.distribute's own small keys.
GROUP_KEY = (1 << 20) - 7
INSTANCE_BASE = 1 << 28


def _collective(replicas, values, instance, merge, timeout):
  with tf.device(replicas.devices[0]):
    return tf.raw_ops.CollectiveReduceV2(
        input=tf.constant(values, tf.int32), group_size=len(replicas.addresses),
        group_key=GROUP_KEY, instance_key=INSTANCE_BASE + instance, ordering_token=[],
        merge_op=merge, final_op="Id", timeout_seconds=timeout).numpy()


def exchange(replicas, settings, timeout):
  """[settings of task 0, of task 1, ...] (every process calls this at once)."""
  mine = np.frombuffer(json.dumps(settings, sort_keys=True).encode("utf-8"), np.uint8)
  n = len(replicas.addresses)
  lengths = np.zeros([n], np.int32)
  lengths[replicas.task] = len(mine)
  try:
    lengths = _collective(replicas, lengths, 0, "Add", timeout)
    everyone = []
    for task in range(n):
      values = np.zeros([int(lengths[task])], np.int32)
      if task == replicas.task:
        values[:] = mine
      got = _collective(replicas, values, 1 + task, "Add", timeout)
      everyone.append(json.loads(got.astype(np.uint8).tobytes().decode("utf-8")))
  except tf.errors.OpError as e:
    lost = replicas.monitor.lost_error()
    if lost is not None:
      raise lost from e
    raise replicas.not_joined_error("the processes did not agree on the run",
                                    timeout) from e
  return everyone


def first_difference(everyone):
  """(task, setting, chief's value, task's value) of the first setting (in sorted
  order) where a task differs from task 0, or None."""
  chief = everyone[0]
  for task, theirs in enumerate(everyone[1:], 1):
    for key in sorted(set(chief) | set(theirs)):
      if chief.get(key) != theirs.get(key):
        return task, key, chief.get(key, "(unset)"), theirs.get(key, "(unset)")
  return None


def agree_with_chief(replicas, settings, timeout):
  """Raises the same ClusterError in every process when any process's settings differ
  from the chief's, naming the first differing setting and both values."""
  found = first_difference(exchange(replicas, settings, timeout))
  if found is not None:
    task, key, chief_value, value = found
    raise spec.ClusterError(
        "task %d (%s) disagrees with the chief, task 0 (%s), on %s: the chief has %s, "
        "task %d has %s; start every process with the same configuration and model_dir "
        "contents" % (task, replicas.addresses[task], replicas.addresses[0], key,
                      _short(chief_value), task, _short(value)), task=task)


def _short(text, limit=200):
  text = str(text).replace("\n", " ")
  return text if len(text) <= limit else text[:limit] + "..."
