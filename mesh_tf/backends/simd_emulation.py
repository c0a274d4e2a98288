"""CPU emulation runtime of SimdMeshImpl: all cores of the mesh in one TF program.

A laid-out tensor is held *compact*: one tf.Tensor [*extents, *slice_shape] with one
leading axis per mesh axis, in LOGICAL coordinates, of extent 1 along the axes where every
core holds the same slice (numpy broadcasting stands in for the copies), so a replicated
weight is stored and updated once. Slice functions run on all cores at once
(`simd_vectorize`) and each collective is a tensor operation along the mesh axes: no TF
op is emitted per core.

The physical view, `all_slices` ([num_cores, *slice] in PHYSICAL core order: entry c is
physical core c's slice), is built on request.
"""
import numpy as np
import tensorflow as tf

from mesh_tf.backends import simd_vectorize
from mesh_tf.backends.simd_runtime import SimdRuntime
from mesh_tf.backends.simd_vectorize import broadcast_extents
from mesh_tf.errors import LayoutError
from mesh_tf.lowering import laid_out_tensor
from mesh_tf.lowering.mesh_impl import LaidOutVariableBase, graph_cached
from mesh_tf.lowering import reductions
from mesh_tf.shapes import convert_to_shape


class EmulatedLaidOutTensor(laid_out_tensor.LaidOutTensor):
  """One mtf Tensor on every emulated core, kept compact.

  Built from `[stacked]` ([num_cores, *slice] in physical core order, as `all_slices`
  returns it), or by the runtime from a compact tensor.
  """

  def __init__(self, tensor_list, runtime=None, compact=None, sum_recipe=None):
    if compact is None:
      tensor_list = list(tensor_list)
      if len(tensor_list) != 1:
        raise LayoutError("an emulated SIMD laid-out tensor holds one stacked tensor with a "
                          "leading core axis, got a list of %d" % len(tensor_list))
      if runtime is None:
        raise LayoutError("an emulated SIMD laid-out tensor needs its runtime; build it "
                          "with SimdMeshImpl.LaidOutTensor")
      compact = runtime.from_physical(tf.convert_to_tensor(tensor_list[0]))
    self._runtime = runtime
    self.compact = compact
    self._physical = None
    # set when compact is one einsum: sum_recipe(axes) is it SUM-allreduced over axes
    self.sum_recipe = sum_recipe

  def __repr__(self):
    return "EmulatedLaidOutTensor(compact %s)" % self.compact.shape

  @property
  def extents(self):
    """Per mesh axis: its size, or 1 where every core along it holds the same slice."""
    return self.compact.shape.as_list()[:self._runtime.k]

  @property
  def tensor_list(self):
    """[one_slice]: every core's slice, in physical core order."""
    return [self.one_slice]

  @property
  def one_slice(self):
    """The stacked tensor [num_cores, *slice_shape] (physical core order)."""
    if self._physical is None:
      self._physical = self._runtime.to_physical(self.compact)
    return self._physical

  @property
  def slice_shape(self):
    return self.compact.shape.as_list()[self._runtime.k:]

  @property
  def dtype(self):
    return self.compact.dtype


class EmulatedLaidOutVariable(LaidOutVariableBase):
  """One tf.Variable per mtf Variable, holding its compact value."""

  def __init__(self, variable, runtime):
    self._runtime = runtime
    super().__init__(variable)
    initial = self.initial_full_value(variable)
    self.variable = tf.Variable(runtime.compact_from_full(initial, self.shape),
                                name=self.name.replace("/", "_") + "_cores",
                                trainable=False)
    self.extents = self.variable.shape.as_list()[:runtime.k]

  @property
  def laid_out_tensor(self):
    """A read of every core's slice."""
    return self._runtime.wrap(self.variable.value())  # no Identity, unlike read_value()

  def assign_to_slices(self, assign_fn, laid_out_values):
    """assign_fn(variable, value) once on the compact variable (along replicated mesh
    axes, the first core's value is kept)."""
    value = self._runtime.conform(laid_out_values.compact, self.extents)
    return [assign_fn(self.variable, tf.cast(value, self.slice_dtype))]

  def read_full(self):
    """The whole variable in its master dtype (for checkpoints)."""
    full = self._runtime.full_from_compact(self.variable.read_value(), self.shape)
    return tf.cast(full, self.master_dtype)

  def assign_full(self, value):
    """Sets every core's slice from a full-shape value."""
    value = tf.cast(value, self.slice_dtype)
    self.variable.assign(self._runtime.compact_from_full(value, self.shape))


class _Groups:
  """Index arrays of one group assignment over the physical cores."""

  def __init__(self, assignment, num_cores):
    self.assignment = np.asarray(assignment, np.int32)  # [num_groups, group_size]
    flat = self.assignment.reshape(-1)
    self.position = np.argsort(flat).astype(np.int32)  # core c sits at flat[position[c]]
    if sorted(flat.tolist()) != list(range(num_cores)):
      raise LayoutError("group assignment %s does not cover the %d cores exactly once"
                        % (assignment, num_cores))


def _move_axis(rank, source, destination):
  """A transpose permutation moving axis `source` to position `destination`."""
  perm = [i for i in range(rank) if i != source]
  perm.insert(destination, source)
  return perm


class EmulationRuntime(SimdRuntime):
  """The SIMD primitives on compact tensors (see the module docstring)."""

  def __init__(self, impl):
    self._impl = impl
    self.num_cores = impl.size
    self.mesh_shape = impl.shape.to_integer_list
    self.k = len(self.mesh_shape)
    self._groups = {}
    self._l2p = np.array([impl.l2p(p) for p in range(self.num_cores)], np.int32)
    self._p2l = np.array([impl.p2l(c) for c in range(self.num_cores)], np.int32)
    self._identity_map = bool((self._l2p == np.arange(self.num_cores)).all())

  def LaidOutTensor(self, tensor_list):  # pylint: disable=invalid-name
    """The EmulatedLaidOutTensor of [stacked physical slices] on this runtime."""
    return EmulatedLaidOutTensor(tensor_list, self)

  # ---- compact <-> physical ----
  def wrap(self, compact, sum_recipe=None):
    """The laid-out tensor of a compact tf.Tensor."""
    return EmulatedLaidOutTensor(None, self, compact, sum_recipe)

  def to_physical(self, compact):
    """[num_cores, *slice] in physical core order from a compact tensor."""
    shape = compact.shape.as_list()
    full = broadcast_extents(compact, shape[:self.k], self.mesh_shape)
    logical = tf.reshape(full, [self.num_cores] + shape[self.k:])
    return logical if self._identity_map else tf.gather(logical, self._p2l)

  def from_physical(self, stacked):
    """Compact tensor (every extent full) from [num_cores, *slice] in physical order."""
    logical = stacked if self._identity_map else tf.gather(stacked, self._l2p)
    return tf.reshape(logical, self.mesh_shape + stacked.shape.as_list()[1:])

  def conform(self, compact, extents):
    """compact with the given extents: broadcast, or the first core's slice where 1."""
    have = compact.shape.as_list()[:self.k]
    if any(e == 1 and h > 1 for h, e in zip(have, extents)):
      compact = compact[tuple(slice(0, 1) if e == 1 else slice(None) for e in extents)]
      have = [1 if e == 1 else h for h, e in zip(have, extents)]
    return broadcast_extents(compact, have, extents)

  # ---- helpers ----
  def groups(self, mesh_axes):
    """Group assignment (physical core ids) of a collective over mesh_axes."""
    key = tuple(sorted(mesh_axes)) if len(mesh_axes) > 1 else tuple(mesh_axes)
    if key not in self._groups:
      self._groups[key] = _Groups(self._impl._create_group_assignment(list(mesh_axes)),  # pylint: disable=protected-access
                                  self.num_cores)
    return self._groups[key]

  def _full_along(self, t, mesh_axis):
    """t broadcast to the full extent of one mesh axis."""
    extents = t.shape.as_list()[:self.k]
    target = extents[:mesh_axis] + [self.mesh_shape[mesh_axis]] + extents[mesh_axis + 1:]
    return broadcast_extents(t, extents, target)

  # ---- primitives ----
  def slicewise(self, fn, *inputs):
    positions = [i for i, x in enumerate(inputs) if isinstance(x, EmulatedLaidOutTensor)]
    args = [x.compact if isinstance(x, EmulatedLaidOutTensor) else x for x in inputs]
    recipes = {}
    if positions and not self.k:  # one core: the compact tensors are its slices
      out = fn(*args)
      out = (tuple(tf.convert_to_tensor(o) for o in out) if isinstance(out, (tuple, list))
             else tf.convert_to_tensor(out))
    elif positions:
      input_recipes = {i: inputs[i].sum_recipe for i in positions
                       if inputs[i].sum_recipe is not None}
      out = simd_vectorize.run_slicewise(fn, args, positions, self.mesh_shape, recipes,
                                         input_recipes)
    else:  # fn reads no slice, so every core computes the same value: compute it once
      out = fn(*args)
      out = (tuple(self.replicate(o) for o in out) if isinstance(out, (tuple, list))
             else self.replicate(out))
    if isinstance(out, (tuple, list)):
      return tuple(self.wrap(o, recipes.get(i)) for i, o in enumerate(out))
    return self.wrap(out, recipes.get(0))

  def replicate(self, value):
    """The same value on every core (a compact tensor of extents 1)."""
    value = tf.convert_to_tensor(value)
    if value.shape.is_fully_defined():
      return tf.reshape(value, [1] * self.k + value.shape.as_list())
    return tf.reshape(value, tf.concat([tf.ones([self.k], tf.int32), tf.shape(value)], 0))

  def allreduce(self, x, mesh_axes, reduction_fn_string):
    reduction_fn_string = reductions.check_collective_reduction(reduction_fn_string)
    if not mesh_axes:
      return x
    t, extents = x.compact, x.extents
    split = sorted(a for a in mesh_axes if extents[a] > 1)
    if split and reduction_fn_string == "SUM" and x.sum_recipe is not None:
      # contract the mesh axes inside the einsum: no per-core partial sums
      t = x.sum_recipe(tuple(split))
    elif split:
      t = reductions.reduction_fn(reduction_fn_string)(t, axis=split, keepdims=True)
    copies = int(np.prod([self.mesh_shape[a] for a in mesh_axes if extents[a] == 1]))
    if reduction_fn_string == "SUM" and copies > 1:
      # a replicated value summed over its copies
      t = t * tf.cast(copies, t.dtype)
    return self.wrap(t)

  def allconcat(self, x, mesh_axis, concat_axis):
    t = self._full_along(x.compact, mesh_axis)
    shape = t.shape.as_list()
    # the mesh axis goes just before the concat axis, then merges with it
    t = tf.transpose(t, _move_axis(len(shape), mesh_axis, self.k + concat_axis - 1))
    shape[self.k + concat_axis] *= shape[mesh_axis]
    shape[mesh_axis] = 1
    return self.wrap(tf.reshape(t, shape))

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    n = self.mesh_shape[mesh_axis]
    slice_shape = x.slice_shape
    if slice_shape[split_axis] % n:
      raise LayoutError("alltoall over mesh axis %d (size %d): split axis %d of slice %s is "
                        "not divisible" % (mesh_axis, n, split_axis, slice_shape))
    t = self._full_along(x.compact, mesh_axis)
    extents = t.shape.as_list()[:self.k]
    rank = len(slice_shape)
    piece = list(slice_shape)
    piece[split_axis] //= n
    t = tf.reshape(t, extents + piece[:split_axis] + [n] + piece[split_axis:])
    # sender j sits on the mesh axis; the piece k_ it sends is the new axis before split
    mesh = [("m", i) if i != mesh_axis else "j" for i in range(self.k)]
    labels = mesh + [l for i in range(rank)
                     for l in (["k_", i] if i == split_axis else [i])]
    target = [l if l != "j" else "k_" for l in mesh] + [
        l for i in range(rank) for l in (["j", i] if i == concat_axis else [i])]
    t = tf.transpose(t, [labels.index(l) for l in target])
    out_shape = list(piece)
    out_shape[concat_axis] *= n
    return self.wrap(tf.reshape(t, extents + out_shape))

  def receive(self, x, mesh_axis, source_pcoord):
    n = self.mesh_shape[mesh_axis]
    t = x.compact
    if None not in source_pcoord and (x.extents[mesh_axis] == 1 or
                                      list(source_pcoord) == list(range(n))):
      return self.wrap(t)  # every core receives what it already holds
    t = self._full_along(t, mesh_axis)
    if None in source_pcoord:
      zero_shape = t.shape.as_list()
      zero_shape[mesh_axis] = 1
      t = tf.concat([t, tf.zeros(zero_shape, t.dtype)], mesh_axis)  # index n: zeros
    source = [n if s is None else s for s in source_pcoord]
    return self.wrap(tf.gather(t, source, axis=mesh_axis))

  def allsplit(self, x, mesh_axis, split_axis, which=None):
    if isinstance(which, EmulatedLaidOutTensor):
      return self._allsplit_per_core(x, mesh_axis, split_axis, which)
    n = self.mesh_shape[mesh_axis]
    shape = x.compact.shape.as_list()
    axis = self.k + split_axis
    piece = shape[axis] // n
    pieces_shape = shape[:axis] + [n, piece] + shape[axis + 1:]
    pieces = tf.reshape(x.compact, pieces_shape)
    if which is not None:  # every core keeps the same piece
      return self.wrap(tf.gather(pieces, tf.cast(which, tf.int32), axis=axis))
    if shape[mesh_axis] == 1:
      # the n pieces of the replicated slice become the mesh axis
      pieces = tf.transpose(pieces, _move_axis(len(pieces_shape), axis, mesh_axis))
      out_shape = list(shape)
      out_shape[mesh_axis] = n
      out_shape[axis] = piece
      return self.wrap(tf.reshape(pieces, out_shape))
    # core i along the mesh axis keeps piece i of its own slice: a diagonal
    rest = [i for i in range(len(pieces_shape)) if i not in (mesh_axis, axis)]
    pieces = tf.transpose(pieces, [mesh_axis, axis] + rest)
    diag = tf.gather_nd(pieces, [[i, i] for i in range(n)])
    # diag axes: [mesh_axis, *rest]; put the mesh axis back in place
    diag = tf.transpose(diag, _move_axis(len(rest) + 1, 0, mesh_axis))
    return self.wrap(diag)

  def _allsplit_per_core(self, x, mesh_axis, split_axis, which):
    """allsplit with a laid-out `which`: each core picks its own piece."""
    n = self.mesh_shape[mesh_axis]
    full = broadcast_extents(x.compact, x.extents, self.mesh_shape)
    index = broadcast_extents(which.compact, which.extents, self.mesh_shape)
    slice_shape = x.slice_shape
    flat = tf.reshape(full, [self.num_cores] + slice_shape)
    index = tf.reshape(tf.cast(index, tf.int32), [self.num_cores])
    axis = split_axis + 1
    pieces = tf.reshape(flat, [self.num_cores] + slice_shape[:split_axis] + [
        n, slice_shape[split_axis] // n] + slice_shape[split_axis + 1:])
    out = tf.gather(pieces, index, axis=axis, batch_dims=1)
    return self.wrap(tf.reshape(out, self.mesh_shape + out.shape.as_list()[1:]))

  def _iota_along(self, mesh_axis):
    """Coordinates on one mesh axis, as a compact int32 scalar."""
    shape = [1] * self.k
    shape[mesh_axis] = self.mesh_shape[mesh_axis]
    return np.arange(self.mesh_shape[mesh_axis], dtype=np.int32).reshape(shape)

  def laid_out_pnum(self):
    pnums = np.arange(self.num_cores, dtype=np.int32).reshape(self.mesh_shape)
    return self.wrap(tf.constant(pnums))

  def laid_out_pcoord(self, mesh_axis):
    return self.wrap(tf.constant(self._iota_along(mesh_axis)))

  def laid_out_slice_begin(self, tensor_shape):
    tensor_shape = convert_to_shape(tensor_shape)
    layout = self._impl.tensor_layout(tensor_shape)
    sizes = self._impl.slice_shape(tensor_shape)
    extents = [self.mesh_shape[a] if a in layout.mesh_axes else 1 for a in range(self.k)]
    begin = np.zeros(extents + [len(sizes)], np.int32)
    for i, (s, a) in enumerate(zip(sizes, layout)):
      if a is not None:
        begin[..., i] += self._iota_along(a) * s
    return self.wrap(tf.constant(begin))

  def laid_out_slice_num(self, tensor_shape):
    axes = sorted(self._impl.tensor_layout(tensor_shape).mesh_axes)
    num = np.zeros([1] * self.k, np.int32)
    for a in axes:
      num = num * self.mesh_shape[a] + self._iota_along(a)
    return self.wrap(tf.constant(num))

  # ---- full tensors <-> compact / stacked slices ----
  def compact_from_full(self, full, tensor_shape, ops=tf):
    """Cuts a full tf.Tensor (a numpy array with ops=np) into its compact value."""
    tensor_shape = convert_to_shape(tensor_shape)
    layout = self._impl.tensor_layout(tensor_shape)
    sizes = self._impl.slice_shape(tensor_shape)
    blocked_shape, block_axis_of, slice_axes = [], {}, []
    for i, d in enumerate(tensor_shape.dims):
      if layout[i] is not None:
        block_axis_of[layout[i]] = len(blocked_shape)
        blocked_shape.append(self.mesh_shape[layout[i]])
      slice_axes.append(len(blocked_shape))
      blocked_shape.append(sizes[i])
    extents = [self.mesh_shape[a] if a in block_axis_of else 1 for a in range(self.k)]
    perm = [block_axis_of[a] for a in sorted(block_axis_of)] + slice_axes
    if perm != list(range(len(perm))):  # else a reshape does it all
      full = ops.transpose(ops.reshape(full, blocked_shape), perm)
    return ops.reshape(full, extents + sizes)

  def full_from_compact(self, compact, tensor_shape):
    """Inverse of compact_from_full (takes the first copy along replicated axes)."""
    tensor_shape = convert_to_shape(tensor_shape)
    layout = self._impl.tensor_layout(tensor_shape)
    sizes = self._impl.slice_shape(tensor_shape)
    used = sorted(a for a in layout if a is not None)
    extents = [self.mesh_shape[a] if a in used else 1 for a in range(self.k)]
    t = self.conform(compact, extents)
    t = tf.reshape(t, [self.mesh_shape[a] for a in used] + sizes)
    perm = []
    for i, a in enumerate(layout):
      if a is not None:
        perm.append(used.index(a))
      perm.append(len(used) + i)
    if perm != list(range(len(perm))):
      t = tf.transpose(t, perm)
    return tf.reshape(t, tensor_shape.to_integer_list)

  def stack_full(self, full, tensor_shape):
    """Cuts a full tf.Tensor into [num_cores, *slice_shape] (physical core order)."""
    return self.to_physical(self.compact_from_full(full, tensor_shape))

  def import_tf_tensor(self, x, tf_x):
    return self.wrap(self.compact_from_full(tf.convert_to_tensor(tf_x), x.shape))

  def import_constant(self, x, value):
    """The compact value of a numpy array, cut in numpy: one constant per graph and value."""
    key = (self, tuple(x.shape.dimension_names), tuple(x.shape.to_integer_list),
           value.dtype, value.tobytes())
    compact = graph_cached(key, lambda: tf.constant(
        self.compact_from_full(value, x.shape, ops=np)))
    return self.wrap(compact)

  def export_to_tf_tensor(self, x, laid_out_x):
    return self.full_from_compact(laid_out_x.compact, x.shape)

  def make_variable(self, variable):
    return EmulatedLaidOutVariable(variable, self)
