"""utils.run.layout_rules = "auto" prices layouts with mtf.analysis's calibrated memory
model (predict_memory) and refuses, in one line naming the budget and the best layout
found, a model that fits no layout (issue 31, item 5)."""
import re

import gin
import pytest

from mesh_tf import analysis
from mesh_tf.auto_mtf.layout_optimizer import SolverError
from models.transformer.trainer import auto_layout
from models.transformer.trainer import gin_setup
from models.transformer import model_graph
from models.transformer.trainer import train_loop
from models.transformer import utils
from models.transformer.context import ModeKeys

BINDINGS = ["num_layers = 1", "d_model = 16", "d_ff = 32", "num_heads = 4", "d_kv = 4",
            "dropout_rate = 0.0", "Unitransformer.max_length = 16"]


def _model():
  return utils.build_model(model_type="lm", input_vocab_size=256, output_vocab_size=256)


def _choose(memory_cap):
  gin.clear_config()
  try:
    gin_setup.parse_gin([], BINDINGS + [
        "auto_mtf.choose_layout.profile = 'cpu_host'",
        "auto_mtf.choose_layout.memory_cap = %d" % memory_cap])
    return auto_layout.choose(_model, 8, 8, 16, utils.get_variable_dtype(), None)
  finally:
    gin.clear_config()


@pytest.fixture(scope="module")
def train_graph():
  gin.clear_config()
  try:
    gin_setup.parse_gin([], BINDINGS)
    return model_graph.ModelGraph(
        _model(), 8, 16, ["inputs", "targets"], ModeKeys.TRAIN,
        utils.get_variable_dtype(), optimizer=train_loop.make_optimizer(None, None))
  finally:
    gin.clear_config()


def _predicted_peak(graph, mesh_shape, rules):
  return analysis.predict_memory(graph.graph, mesh_shape, rules,
                                 fetches=[graph.loss] + graph.update_ops).peak_bytes


def test_a_model_that_fits_nowhere_is_refused_in_one_line(train_graph):
  with pytest.raises(SolverError) as info:
    _choose(memory_cap=4096)
  message = str(info.value)
  assert "\n" not in message
  assert "utils.run.layout_rules = 'auto'" in message
  assert "fits 4096 bytes per device" in message
  assert "auto_mtf.choose_layout.memory_cap" in message
  best = re.search(r"the least memory is (\d+) bytes \(mesh (\S+), rules (\S+)\)", message)
  assert best, message
  least, mesh, rules = int(best.group(1)), best.group(2), best.group(3)
  # the best it found is priced by the calibrated model
  assert least == _predicted_peak(train_graph, mesh, rules) > 4096


def test_the_chosen_layout_fits_the_budget_by_the_calibrated_model(train_graph):
  single = _predicted_peak(train_graph, "", "")
  cap = single // 2  # too small for one device's copy: the search must split
  chosen, report = _choose(memory_cap=cap)
  peak = _predicted_peak(train_graph, chosen.shape.to_string, str(chosen.layout_rules))
  assert report.chosen.peak_memory == peak <= cap
