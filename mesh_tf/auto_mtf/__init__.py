"""Automatic layout: choose layout rules (and a mesh shape) for an mtf graph.

- The original's API and modules, minimizing scheduled peak memory: `layout(graph,
  mesh_shape, outputs)` and `layout_and_mesh_shape(graph, num_machines, outputs,
  max_dims)`.
- `choose_layout(graph, outputs, num_devices_or_mesh_shape, profile, memory_cap)`:
  the fastest layout by predicted step time under a hardware profile whose peak memory
  fits a cap, searched jointly with the mesh shape, with a report of the choice.
"""
# pylint: disable=g-importing-member
from mesh_tf.auto_mtf import api
from mesh_tf.auto_mtf import candidates
from mesh_tf.auto_mtf import graph_interface
from mesh_tf.auto_mtf import hardware
from mesh_tf.auto_mtf import layout_optimizer
from mesh_tf.auto_mtf import memory_estimator
from mesh_tf.auto_mtf import print_cp_model_solution
from mesh_tf.auto_mtf import report
from mesh_tf.auto_mtf import scheduler
from mesh_tf.auto_mtf import search
from mesh_tf.auto_mtf import step_time
from mesh_tf.auto_mtf import valid_layouts
from mesh_tf.auto_mtf.api import layout, layout_and_mesh_shape
from mesh_tf.auto_mtf.graph_interface import GraphInterface
from mesh_tf.auto_mtf.hardware import PROFILES, HardwareProfile, hardware_profile
from mesh_tf.auto_mtf.layout_optimizer import LayoutOptimizer, SolverError
from mesh_tf.auto_mtf.memory_estimator import MemoryEstimator
from mesh_tf.auto_mtf.report import AutoLayoutReport
from mesh_tf.auto_mtf.search import LayoutSearch, choose_layout
from mesh_tf.auto_mtf.valid_layouts import LayoutValidator
