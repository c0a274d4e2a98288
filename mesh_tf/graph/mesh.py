"""`Mesh`: a named handle for a mesh of processors; its shape comes with the lowering."""


class Mesh:
  """A mesh inside a graph. It knows neither its shape nor its backend: the `Lowering`
  maps each mesh to a MeshImpl, so one program runs under many meshes and layouts."""

  def __init__(self, graph, name, variable_placer=None):
    self._graph = graph
    self._name = name
    self._variable_placer = variable_placer

  def __repr__(self):
    return "Mesh(%r)" % self._name

  @property
  def graph(self):
    return self._graph

  @property
  def name(self):
    return self._name

  @property
  def variable_placer_fn(self):
    """The device for full-shape variable copies: the placer if given, else "cpu:0"."""
    if self._variable_placer is not None:
      return self._variable_placer.device_function
    return "cpu:0"
