"""The mtf op library, one module per op family. This file only imports them."""
from mesh_tf.ops import (assign, control_flow, convolution, creation, custom_gradient,
                         debug, einsum, elementwise, halo, indexing, legacy_helpers,
                         microbatch, operation_classes, pooling, random, reduce, reshape,
                         sampling, scan, slicewise, slicing, sorting, summary, variables,
                         windows)
