"""Collectives over a list of per-device tensors, written as explicit TF device-to-device
copies: the algorithms PlacementMeshImpl runs within each processor group.

Each function takes `xs` (one tf.Tensor per device, in group order) and `devices` (the
matching device strings) and returns one result per device: placed on that device, or,
where the devices share this process's memory, one tensor that every device reads.
"""
import functools

import tensorflow as tf

from mesh_tf.lowering import direct_ops
from mesh_tf.lowering.reductions import binary_reduction_fn, canonical_reduction

# Below this many elements, splitting an allreduce into shards costs more than it saves.
RING_MIN_SIZE = 1024


def device_scope(device):
  """Places the ops made inside on `device`: tf.device(device) when executing eagerly,
  else only the graph's own device scope (tf.device also enters the eager context's,
  a cost paid once per op and device of a lowered step)."""
  if tf.executing_eagerly():
    return tf.device(device)
  return tf.compat.v1.get_default_graph().device(device)


def shares_host_memory(devices):
  """True when every device is a CPU of one process (this one or one remote task, or
  unplaced): copies between them are free."""
  domains = memory_domains(tuple(devices))
  return None not in domains and len(set(domains)) <= 1


@functools.lru_cache(maxsize=256)  # asked at each collective; parsing the names is slow
def memory_domains(devices):
  """Per device, the process whose memory it computes in: "local" (this process or
  unplaced) or (job, replica, task) for a CPU; None for any other device."""
  domains = []
  for d in devices:
    spec = tf.DeviceSpec.from_string(d if d.startswith("/") else "/" + d) if d else None
    if spec is None:
      domains.append("local")
    elif (spec.device_type or "CPU").upper() != "CPU":
      domains.append(None)
    elif spec.job in (None, "localhost"):
      domains.append("local")
    else:
      domains.append((spec.job, spec.replica or 0, spec.task or 0))
  return tuple(domains)


def allreduce(xs, devices, reduction_fn_string="SUM"):
  """Picks the algorithm: where the devices share memory, one AddN (SUM) or a tree whose
  one result every device reads; elsewhere a tree for small tensors, else the ring."""
  size = xs[0].shape.num_elements()
  reduction_fn_string = canonical_reduction(reduction_fn_string)
  if shares_host_memory(devices):
    if reduction_fn_string == "SUM":
      return allreduce_add_n(xs, devices)
    return allreduce_tree(xs, devices, reduction_fn_string, share=True)
  if size is None or size < RING_MIN_SIZE:
    return allreduce_tree(xs, devices, reduction_fn_string)
  return allreduce_ring(xs, devices, reduction_fn_string)


def allconcat(xs, devices, concat_axis):
  """One concat every device reads where transfers are free, else by ring."""
  if shares_host_memory(devices):
    return allconcat_direct(xs, devices, concat_axis)
  return allconcat_ring(xs, devices, concat_axis)


def allreduce_tree(xs, devices, reduction_fn_string="SUM", share=False):
  """Pairwise reduction in log2(n) rounds onto device 0, which hands the total to the
  others (the fewest ops of any allreduce); with share, every device reads device 0's
  total without copies (devices sharing memory)."""
  n = len(xs)
  if n == 1:
    return list(xs)
  reduce = binary_reduction_fn(reduction_fn_string)
  values = list(xs)
  stride = 1
  while stride < n:
    for i in range(0, n - stride, 2 * stride):
      with device_scope(devices[i]):
        values[i] = reduce(values[i], values[i + stride])
    stride *= 2
  if share:
    return [values[0]] * n
  return [values[0]] + [_copy_to(values[0], d) for d in devices[1:]]


def allreduce_add_n(xs, devices):
  """SUM as one AddN on device 0 that every device reads (devices sharing memory)."""
  if len(xs) == 1:
    return list(xs)
  with device_scope(devices[0]):
    return [direct_ops.add_n(list(xs))] * len(xs)


def allconcat_direct(xs, devices, concat_axis):
  """One concat on device 0 that every device reads (devices sharing memory)."""
  with device_scope(devices[0]):
    return [tf.concat(list(xs), concat_axis)] * len(xs)


def _copy_to(x, device):
  with device_scope(device):
    return tf.identity(x)


def _split_on_devices(xs, devices, n, axis):
  """Each device splits its own tensor into n pieces along axis."""
  pieces = []
  for x, d in zip(xs, devices):
    with device_scope(d):
      pieces.append(tf.split(x, n, axis=axis))
  return pieces


def _concat_on_devices(parts, devices, axis):
  """Device i concatenates the list parts[i] along axis."""
  out = []
  for p, d in zip(parts, devices):
    with device_scope(d):
      out.append(tf.concat(p, axis))
  return out


def allreduce_ring_single_shard(xs, devices, reduction_fn_string="SUM"):
  """Reduces along a line of devices: partial results flow from both ends to the middle
  device, which then sends the total back out the way they came."""
  n = len(xs)
  if n == 1:
    return list(xs)
  reduce = binary_reduction_fn(reduction_fn_string)
  middle = n // 2
  partial = xs[0]
  for i in range(1, middle + 1):  # left end -> middle
    with device_scope(devices[i]):
      partial = reduce(partial, xs[i])
  right = xs[n - 1]
  for i in range(n - 2, middle, -1):  # right end -> middle, one running value
    with device_scope(devices[i]):
      right = reduce(right, xs[i])
  if middle < n - 1:
    with device_scope(devices[middle]):
      partial = reduce(partial, right)
  out = [None] * n
  out[middle] = _copy_to(partial, devices[middle])
  for i in range(middle - 1, -1, -1):
    out[i] = _copy_to(out[i + 1], devices[i])
  for i in range(middle + 1, n):
    out[i] = _copy_to(out[i - 1], devices[i])
  return out


def allreduce_ring(xs, devices, reduction_fn_string="SUM"):
  """Allreduce reducing shard i of the flattened tensor along the device line rotated by
  i, so every device does 1/n of the work (one shard for small or indivisible sizes)."""
  n = len(xs)
  shape = xs[0].shape
  size = shape.num_elements()
  if n == 1 or size is None or size < RING_MIN_SIZE or size % n:
    return allreduce_ring_single_shard(xs, devices, reduction_fn_string)
  shards = []
  for x, d in zip(xs, devices):
    with device_scope(d):
      shards.append(tf.split(tf.reshape(x, [-1]), n))
  reduced = [[None] * n for _ in range(n)]  # reduced[device][shard]
  for s in range(n):
    order = [(s + k) % n for k in range(n)]
    out = allreduce_ring_single_shard([shards[i][s] for i in order],
                                      [devices[i] for i in order], reduction_fn_string)
    for i, o in zip(order, out):
      reduced[i][s] = o
  result = []
  for i, d in enumerate(devices):
    with device_scope(d):
      result.append(tf.reshape(tf.concat(reduced[i], 0), shape))
  return result


def allconcat_ring(xs, devices, concat_axis):
  """Each piece travels around the ring one hop at a time; every device then
  concatenates all pieces in group order."""
  n = len(xs)
  have = [{i: xs[i]} for i in range(n)]  # have[device][piece]
  for step in range(1, n):
    for i in range(n):
      source = (i - 1) % n
      piece = (i - step) % n
      have[i][piece] = _copy_to(have[source][piece], devices[i])
  return _concat_on_devices([[h[p] for p in range(n)] for h in have], devices, concat_axis)


def alltoall_pointtwise(xs, devices, split_axis, concat_axis):
  """All-to-all by direct copies: device j gathers piece j of every device."""
  n = len(xs)
  pieces = _split_on_devices(xs, devices, n, split_axis)
  return _concat_on_devices([[pieces[i][j] for i in range(n)] for j in range(n)], devices,
                            concat_axis)


def reduce_scatter(xs, devices, split_axis):
  """SUM of xs where device j keeps only piece j of split_axis (one AddN per device)."""
  n = len(xs)
  if n == 1:
    return list(xs)
  pieces = _split_on_devices(xs, devices, n, split_axis)
  out = []
  for j, device in enumerate(devices):
    with device_scope(device):
      out.append(direct_ops.add_n([pieces[i][j] for i in range(n)]))
  return out


def alltoall_ring(xs, devices, split_axis, concat_axis):
  """All-to-all where every piece moves hop by hop around the ring to its target."""
  n = len(xs)
  pieces = _split_on_devices(xs, devices, n, split_axis)
  arrived = [[None] * n for _ in range(n)]  # arrived[target][source]
  for i in range(n):
    for j in range(n):
      value, at = pieces[i][j], i
      while at != j:
        at = (at + 1) % n
        value = _copy_to(value, devices[at])
      arrived[j][i] = value
  return _concat_on_devices(arrived, devices, concat_axis)
