"""mesh_tf: Mesh-TensorFlow for TensorFlow 2.

`import mesh_tf as mtf` offers the public names of the original `mesh_tensorflow`:
named dimensions, layout rules, the graph language, autodiff and lowering onto a mesh.
"""
# pylint: disable=redefined-builtin,g-importing-member
from mesh_tf import _autograph
from mesh_tf.errors import CheckpointError, LayoutError, MtfError, ShapeError
from mesh_tf.shapes import (Dimension, LayoutRules, MeshLayout, Shape, TensorLayout,
                            anonymous_shape, combined_dimension, convert_to_dimension,
                            convert_to_layout_rules, convert_to_shape, is_subsequence,
                            list_product, pnum_to_group, pnum_to_processor_coordinates,
                            processor_coordinates_to_pnum, processor_groups,
                            tensor_dim_to_mesh_dim_size, tensor_dim_to_size_per_split,
                            transpose_list_of_lists)
from mesh_tf.graph import Graph, Mesh, Operation, Tensor, name_scope, variable_scope
from mesh_tf.lowering import Lowering, MeshImpl, binary_reduction_fn, reduction_fn
from mesh_tf.lowering.checkpoint_hooks import MtfCheckpointSaverListener, MtfRestoreHook
from mesh_tf.lowering.lazy_allreduce import (LazyAllreduceSum, LazyLaidOutTensor,
                                             compatible_lazy_allreduce_sums,
                                             convert_args_to_laid_out_tensors)
from mesh_tf.autodiff import StopGradient, gradients, stop_gradient
from mesh_tf.ops.slicewise import (GenericGradOperation, SlicewiseOperation, cwise,
                                   slicewise)
from mesh_tf.ops.elementwise import (
    abs, add, add_n, binary_arguments_to_tensors, binary_op_with_broadcasting, cast, ceil,
    cos, divide, elu, equal, exp, expm1, floor, floordiv, gelu, greater, greater_equal,
    identity, leaky_relu, less, less_equal, log, log1p, logical_and, logical_not,
    logical_or, maximum, minimum, mod, mtf_abs, mtf_pow, multiply, negative, not_equal,
    ones_like, pow, reciprocal, relu, round, rsqrt, selu, sigmoid, sign, sin, softplus,
    sqrt, square, squared_relu, sub, swish, tanh, to_bfloat16, to_float, to_int32, where,
    zeros_like)
from mesh_tf.ops.reduce import (ReduceOperation, log_softmax, reduce_all, reduce_any,
                                reduce_logsumexp, reduce_max, reduce_mean, reduce_min,
                                reduce_sum, softmax)
from mesh_tf.ops.einsum import EinsumOperation, einsum, matmul
from mesh_tf.ops.reshape import (BroadcastOperation, ReshapeOperation, anonymize,
                                 broadcast, rename_dimension, replace_dimensions, reshape,
                                 transpose)
from mesh_tf.ops.slicing import (ConcatOperation, PadOperation, SliceOperation,
                                 SplitOperation, StackOperation, UnstackOperation, concat,
                                 mtf_slice, pad, shift, slice, split, stack, unstack)
from mesh_tf.ops.indexing import (OneHotOperation, RangeOperation, argmax, cumsum, gather,
                                  mtf_range, one_hot, top_1)
from mesh_tf.ops.creation import (Constant, ImportLaidOutTensorOperation, ImportOperation,
                                  constant, fill, import_fully_replicated,
                                  import_laid_out_tensor, import_tf_tensor, ones, zeros)
from mesh_tf.ops.random import RandomOperation, dropout, random_normal, random_uniform
from mesh_tf.ops.variables import (ReadVariable, StackedVariable, Variable, VariableDType,
                                   get_variable, read_variable)
from mesh_tf.ops.assign import (Assign, Depend, assign, assign_add, assign_add_slice,
                                assign_slice, assign_sub, assign_sub_slice, depend)
from mesh_tf.ops.debug import Print, PrintOperation
from mesh_tf.ops.convolution import (
    Conv2dOperation, Conv2dTransposeOperation, Conv2or3dBackpropFilterOperation,
    Conv2or3dBackpropInputOperation, Conv3dOperation, Conv3dTransposeOperation,
    conv2d_backprop_filter, conv2d_backprop_input, conv2d_transpose_backprop_filter,
    conv2d_transpose_backprop_input, conv3d_backprop_filter, conv3d_backprop_input,
    conv3d_transpose_backprop_filter, conv3d_transpose_backprop_input)
from mesh_tf.ops.pooling import PoolBackPropOperation, PoolOperation, pool_backprop, pool_fn
from mesh_tf.ops.halo import halo_exchange, left_halo_exchange
from mesh_tf.ops.sorting import (TopKOperation, nth_largest_element, nth_smallest_element,
                                 sort, top_k)
from mesh_tf.ops.scan import log_cumsum_exp
from mesh_tf.ops.sampling import sample_with_temperature
from mesh_tf.ops.control_flow import WhileLoopOperation, while_loop
from mesh_tf.ops.custom_gradient import (CustomGradientOperation, clone_operations,
                                         custom_gradient, recompute_grad)
from mesh_tf.ops.microbatch import serialize_training_step
from mesh_tf.ops.windows import (dynamic_shift, pool_tensor_1d, reduce_first,
                                 stride_tensor_1d)
from mesh_tf.ops.summary import (ScalarSummaryOperation, log_variable_sizes,
                                 pretty_print_counters, scalar_summary)
from mesh_tf.ops.legacy_helpers import parallel, verify_no_new_dims
from mesh_tf.ops.operation_classes import (AddOperation, BinaryOpWithBroadcasting,
                                           MinMaxOperation, ScalarAddOperation,
                                           ScalarMultiplyOperation)
from mesh_tf.ops.slicing import ShiftOperation
from mesh_tf import layers, placement_mesh_impl
from mesh_tf.backends.placement import PlacementMeshImpl
from mesh_tf import gspmd_mesh_impl
from mesh_tf.backends.gspmd import GSPMDMeshImpl
from mesh_tf.backends.registry import make_mesh_impl
from mesh_tf import simd_mesh_impl
from mesh_tf.backends.simd import SimdMeshImpl
from mesh_tf.backends.device_coordinates import (pnum_to_processor_coordinates_nd,
                                                 processor_coordinates_to_pnum_map_nd)

range = mtf_range
from mesh_tf import checkpoint
from mesh_tf.checkpoint import CheckpointManager, restore_checkpoint, save_checkpoint
from mesh_tf import analysis
from mesh_tf.analysis.sharding_view import plot_sharding, visualize_sharding
from mesh_tf import auto_mtf
from mesh_tf import (learning_rate_schedules, optimize, utils, beam_search, test_utils,
                     tpu_variables)
from mesh_tf import ops_with_redefined_builtins
ops_with_redefined_builtins.install(globals())
