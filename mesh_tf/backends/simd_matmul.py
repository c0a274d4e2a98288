"""A two-operand einsum of the SIMD emulation as one (batch) matmul.

The replay (`simd_vectorize`) gives each stacked operand leading mesh-axis labels, which
tf.einsum handles by transposing the big operands. `folded_matmul`, tried first, makes a
mesh label of the output that is in one operand only a free dim of that operand (one
matmul of the unsplit size, not a thin one per core); `batched_matmul` makes the mesh
axes (broadcast) batch dims, and contracts a mesh label summed over (in both operands,
not the output) with the slice's contracted dims, so no per-core partial sums are stored.
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
  transpose without a mesh label summed over (the caller then uses tf.einsum)."""
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
  kept = "".join(label for label, summed in batch if not summed)
  summed = "".join(label for label, summed in batch if summed)
  lhs_rest = "".join(c for c in lhs if c not in kept + summed)
  rhs_rest = "".join(c for c in rhs if c not in kept + summed)
  out_rest = out[len(kept):]
  contracted = "".join(c for c in lhs_rest if c in rhs_rest)
  if any(c in out for c in contracted) or (
      "".join(c for c in rhs_rest if c in lhs_rest) != contracted):
    return None
  split_l, split_r = _split_rest(lhs_rest, contracted), _split_rest(rhs_rest, contracted)
  if split_l is None or split_r is None:
    return None
  free_l, free_r = split_l[0], split_r[0]
  inner = summed + contracted  # what the matmul contracts
  size = dict(zip(lhs, x.shape.as_list()))
  size.update(zip(rhs, y.shape.as_list()))
  prod = lambda s: int(np.prod([size[c] for c in s], dtype=np.int64))

  # Transposes and reshapes follow from the labels alone (never from sizes), so the op
  # count does not depend on the mesh shape.
  def as_3d(value, term, free):
    """(value as [kept batch..., free, inner] or [kept batch..., inner, free], whether
    inner comes first)."""
    lead = "".join(c for c in term if c in kept)
    body = "".join(c for c in term if c not in kept)
    contracted_first = body == inner + free
    target = lead + (body if contracted_first or body == free + inner else free + inner)
    if target != term:
      value = direct_ops.transpose(value, [term.index(c) for c in target])
    if (len(free) == 1 and len(inner) == 1 and len(lead) == len(kept) and
        target == term):
      return value, contracted_first
    dims = [size[c] if c in term else 1 for c in kept]
    return direct_ops.reshape(value, dims + (
        [prod(inner), prod(free)] if contracted_first else [prod(free), prod(inner)])
    ), contracted_first

  if not summed and any(not t.startswith("".join(c for c in kept if c in t)) or
                        "".join(c for c in t if c not in kept) not in (
                            inner + f, f + inner)
                        for t, f in ((lhs, free_l), (rhs, free_r))):
    return None  # without a SUM over mesh axes, no transposes: tf.einsum does as well
  (a, adj_l), (b, rhs_inner_first) = as_3d(x, lhs, free_l), as_3d(y, rhs, free_r)
  adj_r = not rhs_inner_first  # the matmul wants rhs as [inner, free]
  if out_rest == free_l + free_r:
    result = direct_ops.matmul(a, b, adjoint_a=adj_l, adjoint_b=adj_r)
  elif out_rest == free_r + free_l:  # out^T = rhs^T lhs^T
    result = direct_ops.matmul(b, a, adjoint_a=not adj_r, adjoint_b=not adj_l)
  else:
    return None
  if len(free_l) == 1 and len(free_r) == 1:
    return result
  return direct_ops.reshape(result, [size[c] for c in out])


def folded_matmul(equation, lhs_value, rhs_value, mesh_labels):
  """lhs, rhs contracted as `equation` says, by one matmul of the unsplit size, where a
  mesh label of the output is in one operand only (made a free dim of that operand);
  None elsewhere, or where the einsum is not a plain product."""
  ins, out = equation.split("->")
  lhs, rhs = ins.split(",")
  if not any(c in mesh_labels and c in out and ((c in lhs) != (c in rhs)) for c in ins):
    return None
  if any(len(set(t)) != len(t) for t in (lhs, rhs, out)) or any(
      c not in out and c not in (rhs if c in lhs else lhs) for c in lhs + rhs) or any(
          c not in lhs + rhs for c in out):
    return None
  x, y = tf.convert_to_tensor(lhs_value), tf.convert_to_tensor(rhs_value)
  if not (x.dtype.is_floating and x.dtype == y.dtype and x.shape.is_fully_defined() and
          y.shape.is_fully_defined()):
    return None
  batch = "".join(c for c in out if c in lhs and c in rhs)
  free_l = "".join(c for c in out if c in lhs and c not in rhs)
  free_r = "".join(c for c in out if c in rhs and c not in lhs)
  inner = "".join(c for c in lhs if c in rhs and c not in out)
  size = dict(zip(lhs, x.shape.as_list()))
  size.update(zip(rhs, y.shape.as_list()))
  prod = lambda s: int(np.prod([size[c] for c in s], dtype=np.int64))

  def as_3d(value, term, free):
    """(value as [batch..., free, inner] or [batch..., inner, free], inner first?)."""
    inner_first = term == batch + inner + free
    target = term if inner_first or term == batch + free + inner else batch + free + inner
    if target != term:
      value = direct_ops.transpose(value, [term.index(c) for c in target])
    dims = [size[c] for c in batch]
    return direct_ops.reshape(value, dims + (
        [prod(inner), prod(free)] if inner_first else [prod(free), prod(inner)])
    ), inner_first

  (a, adj_l), (b, rhs_inner_first) = as_3d(x, lhs, free_l), as_3d(y, rhs, free_r)
  adj_r = not rhs_inner_first
  if out == batch + free_r + free_l:  # out^T = rhs^T lhs^T: no transpose after
    produced = batch + free_r + free_l
    result = direct_ops.matmul(b, a, adjoint_a=not adj_r, adjoint_b=not adj_l)
  else:
    produced = batch + free_l + free_r
    result = direct_ops.matmul(a, b, adjoint_a=adj_l, adjoint_b=adj_r)
  result = direct_ops.reshape(result, [size[c] for c in produced])
  if produced != out:
    result = direct_ops.transpose(result, [produced.index(c) for c in out])
  return result
