"""`TransformerLayer`: the base class of every layer a LayerStack holds, and the
class-name variable scope a layer's variables live in (`class_scope`)."""
import contextlib
import threading

import mesh_tf as mtf
from mesh_tf.graph import current_scope_name


class TransformerLayer:
  """A layer of a Transformer: `call(context, x)` returns a Tensor shaped like x.

  Subclasses hold only hyperparameters; variables are created inside `call`, under the
  variable scope the LayerStack opens for the layer (e.g. "block_000/layer_001"), so the
  checkpoint names follow the original library. Auxiliary losses go to context.losses.
  """

  _name = None

  def call(self, context, x):
    """Applies the layer; x and the result share shape and dtype."""
    raise NotImplementedError("%s.call is not implemented" % type(self).__name__)

  def set_name(self, name):
    """Sets the variable-scope name the LayerStack uses for this layer."""
    self._name = name

  @property
  def name(self):
    """The variable-scope name given by set_name, or None (as in the original: the
    stack then opens no scope of its own, and the class-name scope of
    sublayer_call_layer is the layer's only one)."""
    return self._name

  def to_json(self):
    """A one-line description: class name and hyperparameters."""
    fields = {k.lstrip("_"): v for k, v in sorted(vars(self).items()) if k != "_name"}
    return "%s(%s)" % (type(self).__name__,
                       ", ".join("%s=%r" % item for item in fields.items()))


_INSIDE_LAYER = threading.local()


@contextlib.contextmanager
def class_scope(layer):
  """Opens a variable scope named after the layer's class when the layer is called on
  its own; inside another layer's call (a LayerStack's, or a layer that calls its own
  sublayers, such as the Evolved Transformer's), or inside that scope already, none.

  The original's LayerStack opened the class-name scope around each of its layers and
  a layer called from inside another layer got no scope of its own, so its variables
  sat directly in the caller's scopes ("DecoderAttentionLayer/self_attention/q").
  """
  name = type(layer).__name__
  scope = current_scope_name()
  if getattr(_INSIDE_LAYER, "depth", 0) or scope == name or scope.endswith("/" + name):
    with inside_layer_call():
      yield
    return
  with mtf.variable_scope(name), inside_layer_call():
    yield


@contextlib.contextmanager
def inside_layer_call():
  """Marks the code inside as running in a layer's call (see class_scope)."""
  _INSIDE_LAYER.depth = getattr(_INSIDE_LAYER, "depth", 0) + 1
  try:
    yield
  finally:
    _INSIDE_LAYER.depth -= 1
