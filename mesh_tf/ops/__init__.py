"""The mtf op library, one module per op family. This file only imports them."""
from mesh_tf.ops import (assign, creation, debug, einsum, elementwise, indexing, random,
                         reduce, reshape, slicewise, slicing, variables)
