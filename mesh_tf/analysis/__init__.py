"""Analysis of mtf programs without (or alongside) running them.

- `communication`: bytes each processor sends per collective, summaries and reports of
  what a Lowering emitted (`lowering.comm_records`).
- `cost_model`: the paper's closed-form costs of a graph under a mesh and layout: FLOPs,
  memory and communication per processor, predicted from shapes and layouts alone.
- `memory_model`: the peak memory of one step from tensor lifetimes (`predict_memory`),
  per device and summed over one process's devices; calibrated against TF's allocator.
- `layout_report`: which rule split which dimension of each tensor, unused and
  conflicting rules, and warnings about replicated compute and large allconcats.
- `sharding_view`: a picture of the mesh and the slice of a tensor each processor holds
  (`visualize_sharding` as text, `plot_sharding` with matplotlib).
"""
# pylint: disable=g-importing-member
from mesh_tf.analysis.communication import (bytes_sent_per_processor, format_report,
                                            summarize, total_bytes_per_processor)
from mesh_tf.analysis.cost_model import CostEstimate, estimate_cost
from mesh_tf.analysis.layout_report import LayoutReport, layout_report
from mesh_tf.analysis.sharding_view import plot_sharding, visualize_sharding
from mesh_tf.analysis.memory_model import MemoryPrediction, TrainStepMemory, predict_memory
