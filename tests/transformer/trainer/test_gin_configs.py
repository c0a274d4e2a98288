"""Every gin file under gin_configs/ parses and builds its model; layouts fit the model.

Model files are parsed after defaults.gin and must build a graph (no variables are
allocated: only the mtf graph is built, so the large configs cost nothing). Layout files
are parsed with lm_base.gin; the layout must name only dims the model has and divide
each dim it splits. Problem files must name a dataset function whose data either loads
(the embedded corpus, the synthetic tasks) or is reported missing with a clear error
(TFDS data, text files the user has to give). Layouts larger than the 8 emulated CPUs
run one training step through the trainer on SIMD emulation (marked slow).
"""
import glob
import os

import gin
import pytest

import mesh_tf as mtf
from mesh_tf.shapes import MeshLayout
from models.transformer import model_graph, model_layout, utils
from models.transformer.trainer import gin_setup
from models.transformer.context import ModeKeys

GIN_ROOT = gin_setup.DEFAULT_GIN_LOCATION
ALL_FILES = sorted(os.path.relpath(p, GIN_ROOT)
                   for p in glob.glob(os.path.join(GIN_ROOT, "**", "*.gin"), recursive=True))
MODEL_FILES = [f for f in ALL_FILES if f.startswith("models/")]
LAYOUT_FILES = [f for f in ALL_FILES if f.startswith("layouts/")]
PROBLEM_FILES = [f for f in ALL_FILES if f.startswith("problems/")]
SCHEDULE_FILES = [f for f in ALL_FILES if f.startswith("learning_rate_schedules/")]
# 128-way model parallelism needs a model with at least 128 heads.
LAYOUT_MODEL_BINDINGS = {"layouts/8x8_mp.gin": ["num_heads = 128", "d_kv = 8"]}
# Files parsed after others (the command that uses each is in its header).
RUN_FILES = {
    "readme_lm.gin": ["models/lm_cpu_small.gin", "problems/pydoc_lm.gin",
                      "layouts/2x2_dp_mp.gin"],
    "examples/reverse_tokens_cpu.gin": ["models/bi_cpu_small.gin",
                                        "problems/reverse_tokens.gin"],
    "bf16.gin": ["models/lm_cpu_small.gin", "problems/pydoc_lm.gin",
                 "layouts/2x2_dp_mp.gin", "readme_lm.gin"],
}
LARGE_LAYOUTS = ["layouts/4x4_m4.gin", "layouts/8x8_m4.gin", "layouts/16x16_m8.gin"]


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _run_param(name):
  """The value gin binds to utils.run.<name>, with @references resolved."""
  value = gin.query_parameter("utils.run.%s" % name)
  if isinstance(value, gin.config.ConfigurableReference):
    fn = value.scoped_configurable_fn
    return fn() if value.evaluate else fn
  return value


def _build_graph(batch_size=8, length=16):
  """Builds the eval graph of the model the parsed gin describes."""
  vocabulary = _run_param("vocabulary")
  vocab_size = vocabulary.vocab_size
  mesh_shape = mtf.convert_to_shape(_run_param("mesh_shape"))
  layout = mtf.convert_to_layout_rules(_run_param("layout_rules"))
  model = utils.build_model(model_type=_run_param("model_type"),
                            input_vocab_size=vocab_size, output_vocab_size=vocab_size,
                            layout_rules=layout, mesh_shape=mesh_shape)
  return model, model_graph.ModelGraph(model, batch_size, length, ["inputs", "targets"],
                                       ModeKeys.EVAL, utils.get_variable_dtype())


def test_the_tree_mirrors_the_original():
  assert "defaults.gin" in ALL_FILES
  assert len(MODEL_FILES) >= 12 and len(LAYOUT_FILES) >= 10 and len(PROBLEM_FILES) >= 5
  for name in ["single", "2x2_dp", "2x2_mp", "2x2_dp_mp", "4x4_dp", "8x8_dp", "8x8_mp",
               "16x16_m8"]:
    assert "layouts/%s.gin" % name in LAYOUT_FILES


def test_every_file_is_checked_by_a_test():
  checked = set(MODEL_FILES + LAYOUT_FILES + PROBLEM_FILES + SCHEDULE_FILES) | set(RUN_FILES)
  assert set(ALL_FILES) - checked == {"defaults.gin"}


@pytest.mark.parametrize("path", sorted(RUN_FILES))
def test_run_file_builds_its_model_on_its_mesh(path):
  gin_setup.parse_gin(RUN_FILES[path] + [path])
  mesh_shape = mtf.convert_to_shape(_run_param("mesh_shape"))
  layout = mtf.convert_to_layout_rules(_run_param("layout_rules"))
  sequence_length = _run_param("sequence_length")
  length = sequence_length["targets"] if isinstance(sequence_length, dict) else sequence_length
  batch = utils.compute_batch_size(sequence_length, mesh_shape, layout,
                                   _run_param("batch_size"))
  _, graph = _build_graph(batch_size=batch, length=length)
  model_graph.check_layout_names(graph, MeshLayout(mesh_shape, layout))
  assert not mtf.analysis.layout_report(graph.graph, mesh_shape, layout).conflicts
  assert _run_param("train_steps") > 0


@pytest.mark.parametrize("path", MODEL_FILES)
def test_model_file_builds_its_model(path):
  gin_setup.parse_gin([path])
  model, graph = _build_graph()
  assert graph.loss.shape.ndims == 0
  num_layers = gin.query_parameter("%num_layers")
  stack = model.decoder.layer_stack if hasattr(model, "decoder") else model.layer_stack
  layers_per_block = len(gin.query_parameter("make_layer_stack.layers"))
  if hasattr(model, "decoder"):
    layers_per_block = len(gin.query_parameter("decoder/make_layer_stack.layers"))
    assert type(model).__name__ == "Bitransformer"
  assert len(stack.layers) == num_layers * layers_per_block
  d_model = [d for d in graph.logits.shape.dims if d.name == "vocab"]
  assert d_model and d_model[0].size % 128 == 0  # vocab padded to the vocab_divisor
  names = {n for v in graph.graph.all_variables  # checkpoint names (pipelines: per stage)
           for n in getattr(v, "checkpoint_split", None) or [v.name]}
  assert any("/block_000/layer_000/" in n for n in names), sorted(names)[:5]


@pytest.mark.parametrize("path", LAYOUT_FILES)
def test_layout_file_fits_the_base_model(path):
  gin_setup.parse_gin(["models/lm_base.gin", path], LAYOUT_MODEL_BINDINGS.get(path, []))
  mesh_shape = mtf.convert_to_shape(_run_param("mesh_shape"))
  layout = mtf.convert_to_layout_rules(_run_param("layout_rules"))
  batch = max(8, model_layout.split_size(MeshLayout(mesh_shape, layout), "batch"))
  _, graph = _build_graph(batch_size=batch)
  model_graph.check_layout_names(graph, MeshLayout(mesh_shape, layout))
  report = mtf.analysis.layout_report(graph.graph, mesh_shape, layout)
  assert not report.conflicts, report
  split = {rule[0] for rule in layout if rule[1] in mesh_shape.dimension_names}
  if mesh_shape.size > 1:
    assert "batch" in split or "heads" in split


@pytest.mark.parametrize("path", PROBLEM_FILES)
def test_problem_file_names_a_dataset(path, tmp_path):
  text = tmp_path / "text.txt"
  text.write_text("a line of text for the problem files that read text files\n" * 50)
  gin_setup.parse_gin(["models/tiny.gin", path],
                      ["text_line_dataset.glob = %r" % str(text),
                       "text_corpus_dataset.glob = %r" % str(text)])
  dataset_fn = _run_param("train_dataset_fn")
  vocabulary = _run_param("vocabulary")
  try:
    dataset = dataset_fn(sequence_length={"inputs": 32, "targets": 32},
                         vocabulary=vocabulary, dataset_split="train")
  except mtf.MtfError as e:  # TFDS data is not on this machine: the error says which
    assert "tfds" in path or "lm1b" in path or "wmt" in path, (path, e)
    assert gin.query_parameter("untokenized_tfds_dataset.dataset_name") in str(e)
    return
  example = next(iter(dataset))
  assert example["targets"].shape == [32]
  if _run_param("model_type") == "bitransformer":
    assert example["inputs"].shape == [32]


@pytest.mark.parametrize("path", SCHEDULE_FILES)
def test_schedule_file_gives_a_learning_rate(path):
  gin_setup.parse_gin(["models/tiny.gin", path])
  schedule = _run_param("learning_rate_schedule")
  rate = float(schedule(step=5, total_train_steps=100))
  assert 0.0 < rate <= 0.01


def test_unknown_parameter_in_a_gin_file_names_the_file(tmp_path):
  bad = tmp_path / "bad.gin"
  bad.write_text("utils.run.no_such_parameter = 3\n")
  with pytest.raises(mtf.MtfError, match="bad.gin"):
    gin_setup.parse_gin([str(bad)])


@pytest.mark.slow
@pytest.mark.parametrize("path", LARGE_LAYOUTS)
def test_large_layout_trains_a_step_on_simd_emulation(path, tmp_path):
  gin_setup.parse_gin(
      ["problems/pydoc_lm.gin", path],
      ["num_layers = 1", "d_model = 16", "d_ff = 64", "num_heads = 8", "d_kv = 4",
       "dropout_rate = 0.0", "Unitransformer.max_length = 8",
       "utils.run.sequence_length = 8", "utils.run.batch_size = 64",
       "utils.run.train_steps = 2", "utils.run.save_checkpoints_steps = 2",
       "utils.run.iterations_per_loop = 1", "utils.run.model_dir = %r" % str(tmp_path)])
  assert gin.query_parameter("make_mesh_impl.backend") == "simd"
  utils.run()
  assert os.path.exists(os.path.join(str(tmp_path), "model.ckpt-2.index"))


def test_include_of_a_gin_configs_file_resolves_quietly(tmp_path, caplog):
  user_file = tmp_path / "my_run.gin"
  user_file.write_text("include 'problems/pydoc_lm.gin'\nutils.run.train_steps = 3\n")
  with caplog.at_level("INFO"):
    gin_setup.parse_gin([str(user_file)])
  assert _run_param("train_steps") == 3
  assert _run_param("train_dataset_fn").__name__ == "default_corpus_dataset"
  assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
