"""`ReversibleLayerStack`: a LayerStack whose layers are RevNet blocks.

The residual stream is carried as two halves, both starting as the stack's input x.
Layer i computes f_i with the per-layer sublayers (without the residual) and the halves
advance as (x1, x2) <- (x2, x1 + f_i(x2)) (`mtf.layers.reversible_half_residual_and_swap`).
The output, before the final sublayers, is x1 + x2.
"""
import gin

import mesh_tf as mtf
from models.transformer import layer_stack as layer_stack_lib


def reversible_default_sublayers_per_layer():
  """rms_norm -> call_layer -> dropout: the default chain without the residual."""
  return [layer_stack_lib.sublayer_rms_norm, layer_stack_lib.sublayer_call_layer,
          layer_stack_lib.sublayer_dropout]


@gin.configurable(module="transformer")
class ReversibleLayerStack(layer_stack_lib.LayerStack):
  """A LayerStack of reversible residual blocks (see the module docstring).

  Args: those of LayerStack; sublayers_per_layer defaults to rms_norm, call_layer,
  dropout, and may not contain sublayer_residual. recompute_grads rebuilds activations
  in the backward pass to save memory (the same numbers).
  """

  def __init__(self, layers, sublayers_initial=None, sublayers_per_layer=None,
               sublayers_final=None, dropout_rate=None, norm_epsilon=None,
               recompute_grads=False):
    if sublayers_per_layer is None and dropout_rate is None:
      sublayers_per_layer = reversible_default_sublayers_per_layer()
    super().__init__(layers, sublayers_initial, sublayers_per_layer, sublayers_final,
                     dropout_rate, norm_epsilon, recompute_grads=False)
    if dropout_rate is not None:  # legacy lists: drop their residual
      self._sublayers_per_layer = [s for s in self._sublayers_per_layer
                                   if s is not layer_stack_lib.sublayer_residual]
    if layer_stack_lib.sublayer_residual in self._sublayers_per_layer:
      raise mtf.MtfError("ReversibleLayerStack: sublayers_per_layer may not contain "
                         "sublayer_residual; the reversible block adds the residual")
    self._reversible_recompute = recompute_grads

  def _call_layers(self, context, x):
    """The reversible blocks; returns x1 + x2."""
    x1, x1_backwards, x2, x2_backwards = x, None, x, None
    context.layer_index = 0
    for lnum, layer in enumerate(self._layers):
      with mtf.variable_scope(layer.name or ""):
        def fn(h, layer=layer):
          return self._layer_fn(h, layer, context)
        x1, x1_backwards, x2, x2_backwards = (
            mtf.layers.reversible_half_residual_and_swap(
                x1, x1_backwards, x2, x2_backwards, fn,
                recompute_grads=self._reversible_recompute))
      if lnum != len(self._layers) - 1:
        layer_stack_lib._record_output(context, x2)  # pylint: disable=protected-access
      context.layer_index += 1
    return x1 + x2
