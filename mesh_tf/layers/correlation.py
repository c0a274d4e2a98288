"""`corr`: Pearson correlation between the variables indexed by one dim."""
from mesh_tf.errors import ShapeError
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops.einsum import einsum
from mesh_tf.ops.reduce import reduce_mean
from mesh_tf.ops.reshape import rename_dimension
from mesh_tf.shapes import Dimension, convert_to_dimension


def corr(x, dim, epsilon=1e-20, name="pearson_correlation"):
  """Pearson correlation matrix of the variables along `dim`; every other dim of x
  indexes samples.

  Returns [dim, dim_prime] (dim_prime: "<dim name>_prime", same size):
  cov(i, j) / sqrt(var(i) var(j) + epsilon).
  """
  dim = convert_to_dimension(dim)
  if dim not in x.shape.dims:
    raise ShapeError("corr %r: %s is not a dim of %s %s" % (name, dim, x.name, x.shape),
                     tensor=x.name, dim=dim.name)
  if x.shape.ndims < 2:
    raise ShapeError("corr %r: %s %s has no sample dims besides %s" % (
        name, x.name, x.shape, dim), tensor=x.name, dim=dim.name)
  prime = Dimension(dim.name + "_prime", dim.size)
  centered = x - reduce_mean(x, output_shape=[dim])
  centered_prime = rename_dimension(centered, dim.name, prime.name)
  num_samples = float(x.shape.size // dim.size)
  cov = einsum([centered, centered_prime], output_shape=[dim, prime],
               name=name) / num_samples
  var = reduce_mean(ew.square(centered), output_shape=[dim])
  var_prime = rename_dimension(var, dim.name, prime.name)
  return cov * ew.rsqrt(var * var_prime + epsilon)
