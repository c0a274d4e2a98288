"""Variable scopes for layers, with TF1's `default_name` behaviour: an explicit name is
used as given, a missing one becomes "dense", "dense_1", ... within the enclosing scope.
"""
import contextlib

from mesh_tf.graph import current_scope_name, variable_scope


def unique_scope_name(graph, default_name):
  """The first of default_name, default_name_1, ... unused in the current scope."""
  full = graph.unique_name(default_name)
  prefix = current_scope_name()
  return full[len(prefix) + 1:] if prefix else full


@contextlib.contextmanager
def layer_scope(graph, name, default_name):
  """Enters variable_scope(name), or a fresh default_name scope when name is None.

  An explicit name is marked as used too, so a later default scope of the same name
  skips it (as TF1 did).
  """
  if name is None:
    name = unique_scope_name(graph, default_name)
  elif name:
    scope = current_scope_name()
    scoped = scope + "/" + name if scope else name
    if graph.unique_name(name, mark_as_used=False) == scoped:
      graph.unique_name(name)  # marked once: reopening it takes no "<name>_1"
  with variable_scope(name):
    yield name
