"""Orders the operations of a graph to keep its peak memory low.

- "NAIVE": the graph's own order (already topological).
- "LIST": a greedy list scheduler. Among the operations whose inputs are all computed,
  it runs next the one that grows memory least: bytes of its outputs minus bytes of the
  inputs it is the last reader of (ties go to the earlier operation in the graph).
  Greedy choices can lose to the graph's own order; the order of lower peak is kept.
Sizes are full (unsplit) tensor sizes; the order does not depend on the layout.
"""
import heapq

from mesh_tf.errors import MtfError

SCHEDULERS = ("NAIVE", "LIST")


def minimize_peak_memory(graph, scheduler_alg):
  """A schedule (list of operation indices) of a GraphInterface.

  Args:
    graph: a GraphInterface.
    scheduler_alg: "NAIVE" or "LIST" (see module docstring).

  Raises:
    MtfError naming the known schedulers for any other scheduler_alg.
  """
  if scheduler_alg == "NAIVE":
    return list(range(graph.get_num_operations()))
  if scheduler_alg == "LIST":
    naive = list(range(graph.get_num_operations()))
    listed = _list_schedule(graph)
    return listed if _peak(graph, listed) <= _peak(graph, naive) else naive
  raise MtfError("unknown scheduler_alg %r; use one of %s" % (scheduler_alg, SCHEDULERS))


def _peak(graph, schedule):
  """Peak full bytes held under a schedule."""
  held = [0] * (len(schedule) + 1)
  for name, (start, end) in graph.tensor_lifetimes(schedule).items():
    size = graph.get_tensor_size(name)
    held[start] += size
    held[end + 1] -= size
  peak = total = 0
  for h in held:
    total += h
    peak = max(peak, total)
  return peak


def _list_schedule(graph):
  """Greedy list scheduling (see module docstring)."""
  names = graph.get_all_operation_names()
  preds = graph.operation_predecessors()
  succs = [[] for _ in names]
  for i, p in enumerate(preds):
    for j in p:
      succs[j].append(i)
  waiting = [len(set(p)) for p in preds]
  producer = {}
  for i, n in enumerate(names):
    for t in graph.get_operation_output_names(n):
      producer[t] = i
  inputs = [[t for t in set(graph.get_operation_input_names(n)) if t in producer]
            for n in names]
  readers = {}
  for i, ins in enumerate(inputs):
    for t in ins:
      readers.setdefault(t, []).append(i)
  readers_left = {t: len(r) for t, r in readers.items()}
  out_bytes = [sum(graph.get_tensor_size(t) for t in graph.get_operation_output_names(n))
               for n in names]
  size = {t: graph.get_tensor_size(t) for t in readers_left}

  def growth(i):
    freed = sum(size[t] for t in inputs[i]
                if readers_left[t] == 1 and not graph.is_tensor_final(t))
    return out_bytes[i] - freed

  # A heap keyed by (growth, index). Growth falls when an op becomes the last reader of
  # an input: that op is then pushed again with its new key, and entries whose key is
  # stale are skipped or re-pushed when popped.
  ready = [(growth(i), i) for i in range(len(names)) if waiting[i] == 0]
  heapq.heapify(ready)
  schedule = []
  done = [False] * len(names)
  while ready:
    key, i = heapq.heappop(ready)
    if done[i]:
      continue
    current = growth(i)
    if current != key:
      heapq.heappush(ready, (current, i))
      continue
    done[i] = True
    schedule.append(i)
    for t in inputs[i]:
      readers_left[t] -= 1
      if readers_left[t] == 1:
        for j in readers[t]:
          if not done[j] and waiting[j] == 0:
            heapq.heappush(ready, (growth(j), j))
    for j in succs[i]:
      waiting[j] -= 1
      if waiting[j] == 0:
        heapq.heappush(ready, (growth(j), j))
  if len(schedule) != len(names):
    raise MtfError("the graph has a cycle: %d of %d operations could be scheduled"
                   % (len(schedule), len(names)))
  return schedule
