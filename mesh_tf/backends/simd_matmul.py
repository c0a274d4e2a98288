"""A two-operand einsum of the SIMD emulation as one broadcasting batch matmul.

The replay (`simd_vectorize`) gives each stacked operand leading mesh-axis labels. A mesh
label found in one operand and the output (e.g. "Zabc,Ycd->ZYabd": Z and Y each index
one operand's cores), or in both operands but not the output (a SUM over cores fused into
the einsum), makes tf.einsum transpose the big operands and its result. Written as
`tf.linalg.matmul` with the mesh axes as (broadcast) batch dims instead, the same
contraction needs only reshapes, plus one reduce_sum over the summed mesh axes.
(Only the replay calls this: with the speed layer off, neither runs.)
"""
import numpy as np
import tensorflow as tf

from mesh_tf.lowering import direct_ops


def _prefix_batch(lhs, rhs, out, mesh_labels):
  """Leading labels that can be batch dims: [(label, summed)], or None.

  A batch label leads the rest of each operand that has it: one in both operands and the
  output, a mesh label in one operand and the output (broadcast in the other), or a mesh
  label in both operands only (summed after the matmul).
  """
  batch, i, j = [], 0, 0
  while i < len(lhs) or j < len(rhs):
    a = lhs[i] if i < len(lhs) else None
    b = rhs[j] if j < len(rhs) else None
    if a is not None and a == b and (a in out or a in mesh_labels):
      batch.append((a, a not in out))
      i, j = i + 1, j + 1
    elif a in mesh_labels and a in out and a not in rhs:
      batch.append((a, False))
      i += 1
    elif b in mesh_labels and b in out and b not in lhs:
      batch.append((b, False))
      j += 1
    else:
      break
  kept = "".join(label for label, summed in batch if not summed)
  return batch if out.startswith(kept) else None


def _split_rest(rest, contracted):
  """(free labels, contracted first?) if rest is free+contracted or contracted+free."""
  free = "".join(c for c in rest if c not in contracted)
  if rest == free + contracted:
    return free, False
  if rest == contracted + free:
    return free, True
  return None


def batched_matmul(equation, lhs_value, rhs_value, mesh_labels):
  """lhs, rhs contracted as `equation` says, by one matmul; None where that would need a
  transpose (the caller then uses tf.einsum)."""
  ins, out = equation.split("->")
  lhs, rhs = ins.split(",")
  if not any(c in mesh_labels for c in ins):
    return None
  if len(set(lhs)) != len(lhs) or len(set(rhs)) != len(rhs) or (
      any(c not in out and c not in (rhs if c in lhs else lhs) for c in lhs + rhs)):
    return None
  x, y = tf.convert_to_tensor(lhs_value), tf.convert_to_tensor(rhs_value)
  if not x.dtype.is_floating or not (x.shape.is_fully_defined() and
                                     y.shape.is_fully_defined()):
    return None
  batch = _prefix_batch(lhs, rhs, out, mesh_labels)
  if batch is None:
    return None
  labels = "".join(label for label, _ in batch)
  lhs_rest = "".join(c for c in lhs if c not in labels)
  rhs_rest = "".join(c for c in rhs if c not in labels)
  out_rest = out[len([1 for _, summed in batch if not summed]):]
  contracted = "".join(c for c in lhs_rest if c in rhs_rest)
  if any(c in out for c in contracted) or (
      "".join(c for c in rhs_rest if c in lhs_rest) != contracted):
    return None
  split_l, split_r = _split_rest(lhs_rest, contracted), _split_rest(rhs_rest, contracted)
  if split_l is None or split_r is None:
    return None
  (free_l, adj_l), (free_r, adj_r) = split_l, split_r
  adj_r = not adj_r  # the matmul wants rhs as [contracted, free]
  size = dict(zip(lhs, x.shape.as_list()))
  size.update(zip(rhs, y.shape.as_list()))
  prod = lambda s: int(np.prod([size[c] for c in s], dtype=np.int64))

  # Reshapes are skipped by the labels alone (never by sizes), so the op count does not
  # depend on the mesh shape.
  def as_3d(value, term, free, contracted_first):
    if len(free) == 1 and len(contracted) == 1 and all(c in term for c in labels):
      return value
    dims = [size[c] if c in term else 1 for c in labels]
    return direct_ops.reshape(value, dims + (
        [prod(contracted), prod(free)] if contracted_first else [prod(free), prod(contracted)]))
  a, b = as_3d(x, lhs, free_l, adj_l), as_3d(y, rhs, free_r, not adj_r)
  if out_rest == free_l + free_r:
    result = direct_ops.matmul(a, b, adjoint_a=adj_l, adjoint_b=adj_r)
  elif out_rest == free_r + free_l:  # out^T = rhs^T lhs^T
    result = direct_ops.matmul(b, a, adjoint_a=not adj_r, adjoint_b=not adj_l)
  else:
    return None
  summed = [i for i, (_, s) in enumerate(batch) if s]
  if summed:
    result = tf.reduce_sum(result, summed)
  if len(free_l) == 1 and len(free_r) == 1:
    return result
  return direct_ops.reshape(result, [size[c] for c in out])
