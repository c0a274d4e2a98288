"""The local einsum of a slice: some two-operand einsums as explicit transposes, one
(batch) matmul and reshapes.

TF's CPU einsum kernel is about 2.5x slower than `tf.transpose` + `BatchMatMulV2` where the
first operand's contracted dims are not its last ones (the attention gradients
"abcd,abce->aecd"), and about 12x slower than MatMul in bfloat16 and float16; there the
einsum becomes a matmul (transposes moving only dims of size 1 become reshapes). An
einsum already in matmul order ([batch, free, contracted] times [batch, contracted,
free] or [batch, free, contracted]) with few rows (SMALL_MATMUL_ROWS: a decoding step)
becomes reshapes around one matmul too. Elsewhere it stays one op. In the SIMD replay
the choice depends on labels only, never on sizes. Backends compiled by XLA keep
`tf.einsum`, with operands in the output's order (`operands_in_output_order`).
"""
import numpy as np
import tensorflow as tf

from mesh_tf.lowering import direct_ops


def einsum(equation, *operands, as_matmul=True):
  """tf.einsum(equation, *operands); as a matmul where that is possible, faster, and
  as_matmul."""
  equation, operands = operands_in_output_order(equation, operands)
  if as_matmul and len(operands) == 2:
    result = two_operand_matmul(equation, operands[0], operands[1], by_sizes=True)
    if result is not None:
      return result
  return direct_ops.einsum(equation, *operands)


def operands_in_output_order(equation, operands):
  """Swaps a two-operand einsum whose output lists the second operand's free labels
  before the first's (a weight gradient "abc,abd->dc"), so the product lands in the
  output's order without a transpose of the big operand."""
  if len(operands) != 2 or "->" not in equation:
    return equation, tuple(operands)
  ins, out = equation.split("->")
  lhs, rhs = ins.split(",")
  free = [c for c in out if (c in lhs) != (c in rhs)]
  if free and free[0] in rhs and free[-1] in lhs:
    return "%s,%s->%s" % (rhs, lhs, out), (operands[1], operands[0])
  return equation, tuple(operands)


def _groups(lhs, rhs, out):
  """(batch, free lhs, free rhs, contracted) label strings, or None if the einsum is not
  a plain product (a repeated label, or a label summed within one operand)."""
  if "." in lhs + rhs + out or any(len(set(t)) != len(t) for t in (lhs, rhs, out)):
    return None
  if any(c not in lhs and c not in rhs for c in out):
    return None
  if any(c not in out and c not in other for t, other in ((lhs, rhs), (rhs, lhs))
         for c in t):
    return None
  batch = "".join(c for c in out if c in lhs and c in rhs)
  free_l = "".join(c for c in out if c in lhs and c not in rhs)
  free_r = "".join(c for c in out if c in rhs and c not in lhs)
  contracted = "".join(c for c in lhs if c in rhs and c not in out)
  return batch, free_l, free_r, contracted


def _arrangement(term, batch, free, contracted):
  """(order, contracted first?) for one operand: its own order when it already reads
  batch + free + contracted or batch + contracted + free, else batch + free + contracted."""
  for contracted_first in (False, True):
    order = batch + (contracted + free if contracted_first else free + contracted)
    if term == order:
      return order, contracted_first
  return batch + free + contracted, False


def _contracted_order(lhs, rhs, contracted):
  """The contracted labels in lhs's order, or rhs's when that spares a transpose."""
  lhs_order = "".join(c for c in lhs if c in contracted)
  rhs_order = "".join(c for c in rhs if c in contracted)
  if lhs_order == rhs_order:
    return lhs_order
  return rhs_order if rhs_order in rhs and lhs_order not in lhs else lhs_order


def reshape_if_needed(value, shape):
  """value reshaped to shape, without an op where nothing changes."""
  return value if value.shape.as_list() == shape else direct_ops.reshape(value, shape)


def permute_dims(value, perm):
  """tf.transpose(value, perm); a reshape where perm only moves dims of size 1."""
  shape = value.shape.as_list()
  if [i for i in perm if shape[i] != 1] == [i for i in range(len(perm)) if shape[i] != 1]:
    return direct_ops.reshape(value, [shape[i] for i in perm])
  return direct_ops.transpose(value, perm)


# An einsum already in matmul order whose product has at most this many rows (a decoding
# step's [batch, d_model] activations) runs as one MatMul: there TF's einsum kernel costs
# 2-3x the matmul's (a [16, 64] x [64, 256] product: 36 against 11 us). On more rows
# the two take about the same time and the einsum stays: a training step's sums then
# stay TF's einsum kernel's (with MatMul `make train` printed other losses).
SMALL_MATMUL_ROWS = 256


def _product(size, labels):
  return int(np.prod([size[c] for c in labels], dtype=np.int64))


def _worthwhile(lhs, out_of_place, contracted, size):
  """Whether transposes + matmul beat TF's einsum kernel: where the first operand's
  contracted labels are not its last, or (sizes known) every transpose only moves dims
  of size 1."""
  if not lhs.endswith("".join(c for c in lhs if c in contracted)):
    return True
  return size is not None and all(
      [c for c in order if size[c] != 1] == [c for c in term if size[c] != 1]
      for term, order in out_of_place)


def two_operand_matmul(equation, lhs_value, rhs_value, by_sizes=False):
  """The einsum of two float tensors of known shape as transposes + matmul, or None
  where TF's einsum is as good. by_sizes: the choice may depend on dim sizes (not in the
  SIMD replay, whose ops must not depend on the mesh shape)."""
  if "->" not in equation:
    return None
  x, y = tf.convert_to_tensor(lhs_value), tf.convert_to_tensor(rhs_value)
  if not (x.dtype.is_floating and x.dtype == y.dtype and x.shape.is_fully_defined()
          and y.shape.is_fully_defined()):
    return None
  ins, out = equation.split("->")
  lhs, rhs = ins.split(",")
  groups = _groups(lhs, rhs, out)
  if groups is None or len(lhs) != x.shape.rank or len(rhs) != y.shape.rank:
    return None
  batch, free_l, free_r, contracted = groups
  if not contracted and not (free_l and free_r):
    return None  # a broadcasting product: one Mul, not a matmul
  contracted = _contracted_order(lhs, rhs, contracted)
  produced = batch + free_l + free_r
  out_of_place = [(term, order) for term, order in (
      (lhs, _arrangement(lhs, batch, free_l, contracted)[0]),
      (rhs, _arrangement(rhs, batch, free_r, contracted)[0]),
      (produced, out)) if term != order]
  size = dict(zip(lhs, x.shape.as_list()))
  size.update(zip(rhs, y.shape.as_list()))
  # Narrow floats always take the matmul (see the module docstring).
  if x.dtype.size >= 4:
    if out_of_place and not _worthwhile(lhs, out_of_place, contracted,
                                        size if by_sizes else None):
      return None
    if not out_of_place and not (
        by_sizes and contracted and free_l
        and not _arrangement(lhs, batch, free_l, contracted)[1]
        and _product(size, batch + free_l) <= SMALL_MATMUL_ROWS):
      return None
  prod = lambda labels: _product(size, labels)

  def as_3d(value, term, free):
    order, contracted_first = _arrangement(term, batch, free, contracted)
    if order != term:
      value = permute_dims(value, [term.index(c) for c in order])
    inner = [prod(contracted), prod(free)] if contracted_first else [
        prod(free), prod(contracted)]
    # Batch dims stay (matmul takes any number); the others become one each.
    return reshape_if_needed(value, [size[c] for c in batch] + inner), contracted_first

  a, a_transposed = as_3d(x, lhs, free_l)
  b, b_contracted_first = as_3d(y, rhs, free_r)
  result = direct_ops.matmul(a, b, adjoint_a=a_transposed,
                             adjoint_b=not b_contracted_first)
  result = reshape_if_needed(result, [size[c] for c in produced])
  if produced != out:
    result = permute_dims(result, [produced.index(c) for c in out])
  return result
