"""The coverage ledger: every public op of `mtf` is exercised by a test under tests/ops.

A public op is a function or Operation class that `mesh_tf/__init__.py` exports from
mesh_tf.ops or mesh_tf.autodiff. It counts as covered when a test file under tests/ops
refers to it as `mtf.<name>` (a call, or a row of a parametrized table). Names covered in another way are listed in INDIRECT with the
reason; a gap would be listed in GAPS with the reason, never skipped silently.
"""
import inspect
import pathlib
import re

import mesh_tf as mtf

OPS_TESTS = pathlib.Path(__file__).resolve().parent

# Covered, but not called by that name in tests/ops.
INDIRECT = {
    "mtf_abs": "alias of mtf.abs",
    "mtf_pow": "alias of mtf.pow",
    "mtf_slice": "alias of mtf.slice",
    "mtf_range": "exported as mtf.range too; both spellings point to one function",
    "binary_arguments_to_tensors": "runs inside every binary op with a Python scalar",
    "ones_like": "used by mtf.gradients for the default grad_ys",
}
# Public ops known not to work yet (none today).
GAPS = {}


def _public_ops():
  names = []
  for name, value in vars(mtf).items():
    if name.startswith("_") or not callable(value):
      continue
    module = getattr(value, "__module__", "") or ""
    if not module.startswith(("mesh_tf.ops", "mesh_tf.autodiff")):
      continue
    if inspect.isclass(value):
      continue  # classes are reached through their functions
    names.append(name)
  return sorted(set(names))


def test_every_public_op_is_tested_or_listed():
  sources = "\n".join(p.read_text() for p in OPS_TESTS.glob("test_*.py")
                      if p.name != pathlib.Path(__file__).name)
  untested = [n for n in _public_ops()
              if not re.search(r"\bmtf\.%s\b" % n, sources)
              and n not in INDIRECT and n not in GAPS]
  assert not untested, "public ops with no test in tests/ops: %s" % untested


def test_ledger_has_no_stale_entries():
  public = set(_public_ops())
  stale = [n for n in list(INDIRECT) + list(GAPS) if n not in public]
  assert not stale, "ledger names that are no longer public ops: %s" % stale


# The public names of the original's ops.py language core (API_CHECKLIST.md sections 1.4
# and 1.5: Operation classes and functions). Each must be exported, or be listed in
# NOT_EXPORTED with the reason.
ORIGINAL_OPS_NAMES = """
SlicewiseOperation GenericGradOperation ScalarMultiplyOperation ScalarAddOperation
BinaryOpWithBroadcasting AddOperation MinMaxOperation BroadcastOperation ReduceOperation
PoolOperation PoolBackPropOperation ConcatOperation SplitOperation StackOperation
UnstackOperation EinsumOperation Conv2dOperation Conv3dOperation Conv2dTransposeOperation
Conv3dTransposeOperation Conv2or3dBackpropInputOperation Conv2or3dBackpropFilterOperation
ShiftOperation SliceOperation PadOperation OneHotOperation ImportOperation
ImportLaidOutTensorOperation ReadVariable Assign Depend Constant StopGradient
ScalarSummaryOperation PrintOperation ReshapeOperation TopKOperation RangeOperation
RandomOperation WhileLoopOperation CustomGradientOperation Variable
slicewise cwise identity sin cos square sqrt rsqrt log exp sigmoid tanh negative
logical_not reciprocal relu leaky_relu sign abs mtf_abs pow mtf_pow swish gelu elu selu
softplus cast to_float to_bfloat16 to_int32 add sub multiply divide minimum maximum
floordiv mod add_n binary_op_with_broadcasting binary_arguments_to_tensors less greater
less_equal greater_equal equal not_equal logical_and logical_or where broadcast
reduce_sum reduce_mean reduce_max reduce_min reduce_all reduce_any reduce_logsumexp
softmax log_softmax reduce_first nth_largest_element nth_smallest_element einsum matmul
reshape transpose rename_dimension replace_dimensions anonymize anonymous_shape
combined_dimension concat split stack unstack slice mtf_slice pad shift dynamic_shift
halo_exchange left_halo_exchange pool_tensor_1d stride_tensor_1d cumsum top_k top_1
argmax sample_with_temperature one_hot gather range mtf_range constant zeros zeros_like
ones ones_like random_uniform random_normal dropout import_tf_tensor
import_fully_replicated import_laid_out_tensor get_variable read_variable assign
assign_add assign_sub assign_slice assign_add_slice assign_sub_slice depend gradients
stop_gradient custom_gradient recompute_grad while_loop serialize_training_step
conv2d_backprop_input conv2d_backprop_filter conv3d_backprop_input conv3d_backprop_filter
conv2d_transpose_backprop_input conv2d_transpose_backprop_filter
conv3d_transpose_backprop_input conv3d_transpose_backprop_filter pool_backprop Print
scalar_summary log_variable_sizes pretty_print_counters pnum_to_processor_coordinates
processor_coordinates_to_pnum pnum_to_group processor_groups tensor_dim_to_mesh_dim_size
tensor_dim_to_size_per_split list_product parallel transpose_list_of_lists
is_subsequence verify_no_new_dims reduction_fn binary_reduction_fn pool_fn
""".split()

NOT_EXPORTED = {}  # every original ops.py name is exported today


def test_original_ops_names_are_exported_or_listed():
  missing = [n for n in ORIGINAL_OPS_NAMES if not hasattr(mtf, n) and n not in NOT_EXPORTED]
  assert not missing, "original ops.py names that mtf does not export: %s" % missing
  stale = [n for n in NOT_EXPORTED if hasattr(mtf, n)]
  assert not stale, "now exported, drop them from NOT_EXPORTED: %s" % stale
