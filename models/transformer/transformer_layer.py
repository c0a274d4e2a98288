"""`TransformerLayer`: the base class of every layer a LayerStack holds."""


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
