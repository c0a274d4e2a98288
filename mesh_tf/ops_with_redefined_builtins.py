"""The original's `mesh_tensorflow.ops_with_redefined_builtins`: every public op name.

Its names include the four that shadow Python builtins (`abs`, `pow`, `range`, `slice`).
`mesh_tf.ops` gets the same names without those four. `install()` fills both from the
top-level package once `mesh_tf/__init__.py` has imported everything.
"""
import sys
import types

BUILTIN_SPELLINGS = ("abs", "pow", "range", "slice")


def _public_values(namespace):
  return {name: value for name, value in namespace.items()
          if not name.startswith("_") and not isinstance(value, types.ModuleType)}


def install(package_namespace):
  """Copies the public non-module names of `package_namespace` here and into mesh_tf.ops.

  Names of `mesh_tf.ops` that were submodules of the same name (`einsum`, `reshape`,
  `assign`, `slicewise`, `custom_gradient`) become the functions, as in the original;
  `from mesh_tf.ops.einsum import ...` still reaches the submodule through sys.modules.
  """
  values = _public_values(package_namespace)
  this_module = sys.modules[__name__]
  ops_package = sys.modules["mesh_tf.ops"]
  for name, value in values.items():
    setattr(this_module, name, value)
    if name not in BUILTIN_SPELLINGS:
      setattr(ops_package, name, value)
