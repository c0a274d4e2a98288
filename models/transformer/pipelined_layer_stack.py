"""`PipelinedLayerStack`: a LayerStack whose layers run as an S-stage pipeline.

The stack's layers must be one block of P layers repeated (as make_layer_stack builds
them). Block k = r * S + s of the B blocks is stage s of repeat r of
`mtf.layers.pipeline` (B / S = R repeats, the circular schedule when R > 1); each
iteration, each stage runs its block on the microbatch it holds.

Every variable created inside the pipeline gets a leading `stages` dim (a
`Graph.custom_getter`), so a layout rule `stages:<mesh dim>` puts each stage's weights
on its own processors. The variable "<model>/pipeline/repeat_<r>/layer_<p>/<rest>" is,
stage by stage, the plain stack's "<model>/<name of layer (r * S + s) * P + p>/<rest>":
checkpoints store it split under those names (`checkpoint_split`), so the pipelined
and the plain model read and write the same checkpoints.

Context tensors with the batch dim (sequence_id, position, ...) are cut the same way
and stacked per iteration on the stages; inside the pipeline context.batch_dims is
[stages, batch of a microbatch, ...]. A layer adding an auxiliary loss (MoE) is an
error (the loss would count idle stages), and so is `stages` split over a mesh dim of
another size than num_stages. There is no cached decoding (outside train and eval the
stages run one microbatch in turn); decode the checkpoint with the plain LayerStack.
Only the input and the output of the stack go to context.layer_outputs.
"""
import warnings

import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.graph import current_scope_name
from mesh_tf.ops import variables as variables_lib
from models.transformer import layer_stack as ls
from models.transformer.context import ModeKeys

_WHAT = "PipelinedLayerStack"


def _join(*parts):
  return "/".join(p for p in parts if p)


def _signature(layer):
  """What two layers of one place in the repeated block share: class and settings."""
  return type(layer), layer.to_json()


def find_block_size(layers, num_stages, layers_per_block=None):
  """P, the smallest size (or layers_per_block) such that the layers are one block of P
  repeated a multiple of num_stages times (MtfError otherwise)."""
  n = len(layers)
  if n == 0:
    raise mtf.MtfError("%s: no layers" % _WHAT)
  sizes = [layers_per_block] if layers_per_block else range(1, n + 1)
  repeated = []
  for p in sizes:
    if p < 1 or n % p:
      continue
    if all(_signature(layers[i]) == _signature(layers[i % p]) for i in range(n)):
      repeated.append(p)
      if (n // p) % num_stages == 0:
        return p
  if not repeated:
    raise mtf.MtfError(
        "%s: the %d layers are not one block%s repeated (layers_per_block=%r); every "
        "stage must run layers of the same classes and settings" % (
            _WHAT, n, " of %d" % layers_per_block if layers_per_block else "",
            layers_per_block))
  p = repeated[0]
  raise mtf.MtfError("%s: %d layers (%d blocks of %d) do not divide into %d stages" % (
      _WHAT, n, n // p, p, num_stages))


@gin.configurable(module="transformer")
class PipelinedLayerStack(ls.LayerStack):
  """A LayerStack run as a pipeline of num_stages stages over num_microbatches.

  Args:
    layers: one block of named layers repeated, the blocks a multiple of num_stages.
    num_stages: S, the size of the `stages` dim.
    num_microbatches: M (None: S), which must divide the batch. The pipeline's bubble
      is (S - 1) / (M + S - 1).
    layers_per_block: P (None: the smallest that fits).
    sublayers_*, dropout_rate, norm_epsilon, recompute_grads: as LayerStack's (unset
      ones take LayerStack's gin bindings); the initial and final sublayers run
      outside the pipeline.
  """

  def __init__(self, layers, num_stages=2, num_microbatches=None,
               stages_dim_name="stages", microbatch_dim_name="microbatches",
               layers_per_block=None, sublayers_initial=None, sublayers_per_layer=None,
               sublayers_final=None, dropout_rate=None, norm_epsilon=None,
               recompute_grads=None):
    given = dict(sublayers_initial=sublayers_initial,
                 sublayers_per_layer=sublayers_per_layer,
                 sublayers_final=sublayers_final, dropout_rate=dropout_rate,
                 norm_epsilon=norm_epsilon, recompute_grads=recompute_grads)
    super().__init__(layers, **{k: v for k, v in given.items() if v is not None})
    if num_stages < 1 or (num_microbatches is not None and num_microbatches < 1):
      raise mtf.MtfError("%s: num_stages=%r and num_microbatches=%r must be positive" % (
          _WHAT, num_stages, num_microbatches))
    names = [layer.name for layer in self._layers]
    if None in names or len(set(names)) != len(names):
      raise mtf.MtfError("%s: every layer needs its own name (set_name, as "
                         "make_layer_stack does), got %s" % (_WHAT, names))
    self.num_stages = num_stages
    self.num_microbatches = num_microbatches or num_stages
    self.stages_dim_name = stages_dim_name
    self.microbatch_dim_name = microbatch_dim_name
    self.layers_per_block = find_block_size(self._layers, num_stages, layers_per_block)
    self.num_repeats = len(self._layers) // self.layers_per_block // num_stages
    self._warned = False

  @property
  def stages_dim(self):
    return mtf.Dimension(self.stages_dim_name, self.num_stages)

  def call(self, context, x):
    """Runs the initial sublayers, the layers as a pipeline, then the final sublayers."""
    if context.mode in ("incremental", "first_part"):
      raise mtf.MtfError("%s does not decode from cached states (mode %r); decode its "
                         "checkpoint with transformer.LayerStack, which reads the same "
                         "variable names" % (_WHAT, context.mode))
    return super().call(context, x)

  def _call_layers(self, context, x):
    x = self._pipeline(context, x)
    context.layer_index = len(self._layers)
    return x

  def _batch_dim(self, context, x):
    ensemble = set(ls._ensemble_dims(context))  # pylint: disable=protected-access
    for d in context.batch_dims:
      if d not in ensemble and d in x.shape.dims:
        return d
    raise mtf.ShapeError("%s: none of the batch dims %s is a dim of %s %s" % (
        _WHAT, context.batch_dims, x.name, x.shape), tensor=x.name)

  def _microbatches(self, context, batch_dim):
    m = self.num_microbatches
    if context.mode not in (ModeKeys.TRAIN, ModeKeys.EVAL) and batch_dim.size % m:
      return 1  # decoding: the stages in turn
    if batch_dim.size % m:
      raise mtf.ShapeError("%s: batch dim %s:%d does not divide into %d microbatches" % (
          _WHAT, batch_dim.name, batch_dim.size, m), dim=batch_dim.name)
    return m

  def _check_layout(self, context):
    layout = context.mesh_layout
    if layout is None:
      return
    axis = layout.tensor_dimension_to_mesh_axis(self.stages_dim)
    if axis is None:
      if not self._warned:
        warnings.warn("%s: no layout rule splits %r (rules %s), so every processor runs "
                      "all %d stages: correct, but not pipelined" % (
                          _WHAT, self.stages_dim_name, layout.layout_rules,
                          self.num_stages))
        self._warned = True
      return
    size = layout.axis_size(axis)
    if size != self.num_stages:
      raise mtf.LayoutError(
          "%s: num_stages=%d but the layout splits %r over mesh dim %r of size %d; set "
          "num_stages=%d" % (_WHAT, self.num_stages, self.stages_dim_name,
                             layout.shape.dims[axis].name, size, size))

  def _pipeline(self, context, x):
    self._check_layout(context)
    s_, p_ = self.num_stages, self.layers_per_block
    stages_dim = self.stages_dim
    batch_dim = self._batch_dim(context, x)
    m_ = self._microbatches(context, batch_dim)
    schedule = mtf.layers.pipeline_schedule(s_, m_, self.num_repeats)
    calls = [(t, r) for t, it in enumerate(schedule)
             for r in sorted(set(r for _, r in it.slots.values()))]
    calls.reverse()
    outer = current_scope_name()
    stager = _ContextStager(context, batch_dim, m_, stages_dim, self.microbatch_dim_name,
                            schedule)
    slot = {}

    def plain_names(r, p, rest):
      return [_join(outer, self._layers[(r * s_ + s) * p_ + p].name, rest)
              for s in range(s_)]

    def getter(next_getter, mesh, name, shape, initializer=None, **kwargs):
      r, p = slot["now"]
      prefix = _join(outer, "pipeline", "repeat_%d" % r, "layer_%03d" % p) + "/"
      full = _join(current_scope_name(), name)
      if not full.startswith(prefix):
        raise mtf.MtfError("%s: variable %r is created outside its layer's scope %r" % (
            _WHAT, full, prefix))
      names = plain_names(r, p, full[len(prefix):])
      shape = mtf.convert_to_shape(shape)

      def stacked(dims, dtype=tf.float32):
        del dims
        return tf.stack([variables_lib._initial_value(  # pylint: disable=protected-access
            initializer, shape, dtype, n) for n in names])
      value = next_getter(mesh, name, mtf.Shape([stages_dim] + shape.dims),
                          initializer=stacked, **kwargs)
      value.operation.checkpoint_split = names
      return value

    def stage_fn(h, repeat):
      t, r = calls.pop()
      if r != repeat:
        raise mtf.MtfError("%s: pipeline called repeat %d where its schedule has %d" % (
            _WHAT, repeat, r))
      with stager.staged(t):
        for p in range(p_):
          layer = self._layers[p]
          slot["now"] = (r, p)
          context.layer_index = r * s_ * p_ + p
          losses = len(context.losses) if context.losses is not None else 0
          with mtf.variable_scope("layer_%03d" % p):
            if self._recompute_grads:
              h = mtf.recompute_grad(
                  lambda h, layer=layer: self._layer_fn(h, layer, context), [h])
            else:
              h = self._layer_fn(h, layer, context)
          if context.losses is not None and len(context.losses) != losses:
            raise mtf.MtfError(
                "%s: layer %s (%s) adds an auxiliary loss, which a pipeline stage cannot "
                "give (it would count idle stages); use LayerStack" % (
                    _WHAT, layer.name, type(layer).__name__))
      return h

    with context.mesh.graph.custom_getter(getter):
      return mtf.layers.pipeline(stage_fn, x, stages_dim, self.microbatch_dim_name,
                                 num_microbatches=m_, num_repeats=self.num_repeats,
                                 batch_dim=batch_dim, name="pipeline")


class _ContextStager:
  """Swaps the Context's batch_dims and tensors with the batch dim for their per-stage
  values at one iteration (idle stages get the first microbatch, staying finite)."""

  def __init__(self, context, batch_dim, num_microbatches, stages_dim,
               microbatch_dim_name, schedule):
    self._context = context
    self._stages_dim = stages_dim
    self._schedule = schedule
    small = mtf.Dimension(batch_dim.name, batch_dim.size // num_microbatches)
    mb_dim = mtf.Dimension(microbatch_dim_name, num_microbatches)
    self._batch_dims = [stages_dim] + [small if d == batch_dim else d
                                       for d in context.batch_dims]
    self._parts = {}
    for key, value in vars(context).items():
      if isinstance(value, mtf.Tensor) and batch_dim in value.shape.dims:
        split = mtf.replace_dimensions(value, batch_dim, [small, mb_dim])
        self._parts[key] = (mtf.unstack(split, mb_dim) if num_microbatches > 1 else
                            [mtf.reshape(split, split.shape - [mb_dim])])
    self._cache = {}

  def _values(self, t):
    if t not in self._cache:
      slots = self._schedule[t].slots
      held = [slots[s][0] if s in slots else 0 for s in range(self._stages_dim.size)]
      self._cache[t] = {key: mtf.stack([parts[j] for j in held], self._stages_dim.name,
                                       axis=0)
                        for key, parts in self._parts.items()}
    return self._cache[t]

  def staged(self, t):
    return _Swap(self._context, dict(self._values(t), batch_dims=self._batch_dims))


class _Swap:
  """Sets attributes of an object for the duration of a with block."""

  def __init__(self, obj, values):
    self._obj, self._values, self._old = obj, values, None

  def __enter__(self):
    self._old = {k: getattr(self._obj, k) for k in self._values}
    for k, v in self._values.items():
      setattr(self._obj, k, v)

  def __exit__(self, *exc):
    for k, v in self._old.items():
      setattr(self._obj, k, v)
