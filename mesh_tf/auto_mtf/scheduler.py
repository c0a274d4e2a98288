"""Orders the operations of a GraphInterface to keep peak memory low.

- "NAIVE": the graph's own order, range(num operations).
- "LIST": greedy list scheduling, as the original. Of the operations whose inputs are
  all computed, run next the one that frees the most bytes: the bytes of the inputs it is
  the only remaining reader of (final tensors are never freed), less the bytes of its
  outputs that someone reads or that are final (an output nobody needs costs nothing,
  since it is dropped at once). Ties go to the smaller operation name.
Sizes are full (unsplit) tensor sizes; the order does not depend on the layout.
"""
import heapq

from mesh_tf.errors import MtfError

SCHEDULERS = ("NAIVE", "LIST")


class UnknownSchedulerError(MtfError, NotImplementedError):
  """scheduler_alg names no scheduler (a NotImplementedError, as in the original)."""


def minimize_peak_memory(graph, scheduler_alg):
  """A schedule (operation indices, in run order) of a GraphInterface.

  Args:
    graph: a GraphInterface.
    scheduler_alg: "NAIVE" or "LIST" (see module docstring).

  Raises:
    UnknownSchedulerError (a NotImplementedError) for any other scheduler_alg.
  """
  if scheduler_alg == "NAIVE":
    return list(range(graph.get_num_operations()))
  if scheduler_alg == "LIST":
    return _list_schedule(graph)
  raise UnknownSchedulerError("unknown scheduler_alg %r; use one of %s"
                              % (scheduler_alg, ", ".join(SCHEDULERS)))


def _list_schedule(graph):
  """Greedy list scheduling (see module docstring)."""
  names = graph.get_all_operation_names()
  index = {n: i for i, n in enumerate(names)}
  produced = set(graph.get_all_tensor_names())
  inputs = {n: [t for t in graph.get_operation_input_names(n) if t in produced]
            for n in names}
  outputs = {n: graph.get_operation_output_names(n) for n in names}
  # Pending readers of each tensor, and how many distinct inputs each op still waits on.
  pending = {}
  waiting = {}
  for n in names:
    distinct = list(dict.fromkeys(inputs[n]))
    waiting[n] = len(distinct)
    for t in distinct:
      pending.setdefault(t, set()).add(n)

  size = graph.get_tensor_size
  gain = {}
  for n in names:
    g = 0
    for t in inputs[n]:  # counted per occurrence, as the original does
      if len(pending.get(t, ())) == 1 and not graph.is_tensor_final(t):
        g += size(t)
    for t in outputs[n]:
      if pending.get(t) or graph.is_tensor_final(t):
        g -= size(t)
    gain[n] = g

  heap = [(-gain[n], n) for n in names if waiting[n] == 0]
  heapq.heapify(heap)
  schedule = []
  # The original tests the finality of the last output of the most recently run op
  # that had outputs (not of the input at hand) before crediting a lone remaining
  # reader; that quirk is kept so that both give the same order.
  last_output = None
  while heap:
    neg, n = heapq.heappop(heap)
    if gain[n] is None or gain[n] != -neg:
      continue  # already run, or a stale entry superseded by a later push
    schedule.append(index[n])
    gain[n] = None
    for t in outputs[n]:
      last_output = t
      for reader in pending.get(t, ()):
        waiting[reader] -= 1
        if waiting[reader] == 0:
          heapq.heappush(heap, (-gain[reader], reader))
    for t in inputs[n]:
      readers = pending.get(t)
      if readers is None or n not in readers:
        continue  # an input used twice was handled at its first occurrence
      readers.discard(n)
      if len(readers) != 1:
        continue
      if last_output is not None and graph.is_tensor_final(last_output):
        continue
      (other,) = readers
      gain[other] += size(t)
      if waiting[other] == 0:
        heapq.heappush(heap, (-gain[other], other))
  if len(schedule) != len(names):
    raise MtfError("the graph has a cycle: %d of %d operations could be scheduled"
                   % (len(schedule), len(names)))
  return schedule
