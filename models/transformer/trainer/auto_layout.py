"""`utils.run.layout_rules = "auto"`: the layout (and mesh shape) chosen by
mtf.auto_mtf.choose_layout for the train step (the trainer's own graph, optimizer slots
included), before anything else is built. The mesh shape may be a device count (8 or
"8"): then mesh shapes of 1-3 dims are searched too. The choice is printed and appended
to operative_config.gin as bindings, so re-running that file skips the search.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.auto_mtf import memory_estimator
from mesh_tf.auto_mtf.layout_optimizer import SolverError
from mesh_tf.shapes import MeshLayout
from models.transformer import model_graph
from models.transformer.trainer import run_setup
from models.transformer.trainer import train_loop
from models.transformer.context import ModeKeys

AUTO = "auto"


def wants_auto(layout_rules):
  """Whether utils.run.layout_rules asks for the search."""
  return isinstance(layout_rules, str) and layout_rules.strip().lower() == AUTO


def _profile():
  """{} if gin binds auto_mtf.choose_layout.profile, else this host's profile."""
  try:
    gin.query_parameter("auto_mtf.choose_layout.profile")
    return {}  # gin's binding applies
  except ValueError:
    return {"profile": "gpu_h100" if tf.config.list_physical_devices("GPU")
            else "cpu_host"}


def _memory_model():
  """The calibrated peak-memory model (mtf.analysis.predict_memory's) unless gin binds
  auto_mtf.choose_layout.scheduler_alg."""
  try:
    gin.query_parameter("auto_mtf.choose_layout.scheduler_alg")
    return {}
  except ValueError:
    return {"scheduler_alg": memory_estimator.DATAFLOW}


def choose(model_fn, mesh_shape, batch_size, sequence_length, variable_dtype, optimizer):
  """(MeshLayout, report) for the train step of model_fn's model."""
  graph = model_graph.ModelGraph(
      model_fn(), batch_size, sequence_length, ["inputs", "targets"], ModeKeys.TRAIN,
      variable_dtype, optimizer=train_loop.make_optimizer(optimizer, None))
  devices_or_shape = run_setup.device_count(mesh_shape) or mesh_shape
  try:
    chosen_shape, rules, report = mtf.auto_mtf.choose_layout(
        graph.graph, [graph.loss] + graph.update_ops, devices_or_shape,
        **_profile(), **_memory_model())
  except SolverError as e:
    raise SolverError("utils.run.layout_rules = 'auto': %s (the budget is gin's "
                      "auto_mtf.choose_layout.memory_cap, default the hardware profile's "
                      "memory)" % str(e).splitlines()[0]) from None  # gin adds lines
  print("auto layout (utils.run.layout_rules = 'auto'):", flush=True)
  for line in report.summary_lines():
    print("  " + line, flush=True)
  return MeshLayout(chosen_shape, rules), report


def bindings_text(mesh_layout):
  """gin bindings of the chosen MeshLayout, for operative_config.gin."""
  return ("\n# Chosen by utils.run.layout_rules = 'auto' (mtf.auto_mtf.choose_layout):\n"
          "utils.run.mesh_shape = %r\nutils.run.layout_rules = %r\n"
          % (mesh_layout.shape.to_string, str(mesh_layout.layout_rules)))
