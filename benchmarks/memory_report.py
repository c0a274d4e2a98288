"""Bytes per processor of parameters, optimizer state and activations for Transformer
LMs at the paper's scale (up to ~5B parameters on 512 cores), computed from the mtf
graph with the analytic cost model, without running anything.

The models follow the paper's scaling experiment in spirit: 6 layers, d_model 1024,
d_kv 128, with d_ff and the number of heads grown with the number of cores. The exact
hyperparameters of the paper's table are not reproduced here; the parameter count of
each configuration is printed instead. Optimizer state is reported for Adam (two slots
per parameter, laid out like it); activations are an upper bound (every activation
slice of the forward and backward pass counted as live at once), in float32.

  python -m benchmarks.memory_report
"""
from absl import app

from benchmarks import common

# (cores, d_ff, heads)
SCALES = [(8, 4096, 8), (32, 16384, 32), (128, 65536, 128), (512, 262144, 512)]


def main(_):
  from mesh_tf import analysis  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  rows = [["cores", "params", "layout", "params B/core", "Adam B/core",
           "activations B/core", "sent B/core/step"]]
  for cores, d_ff, heads in SCALES:
    c = config.TinyLmConfig(batch=cores, length=256, vocab=32768, d_model=1024,
                            heads=heads, d_kv=128, d_ff=d_ff, num_layers=6)
    model = mtf_model.TinyLmModel(c, weights={n: None for n in config.weight_shapes(c)})
    params = sum(v.shape.size for v in model.variables.values())
    fetches = [model.loss] + model.update_ops
    layouts = [
        ("model-parallel [%d]" % cores, "model:%d" % cores,
         "d_ff:model;heads:model;vocab:model"),
        ("data+model [8,%d]" % (cores // 8), "batch:8;model:%d" % (cores // 8),
         "batch:batch;d_ff:model;heads:model;vocab:model"),
    ]
    for label, mesh_shape, rules in layouts:
      cost = analysis.estimate_cost(model.graph, mesh_shape, rules, fetches=fetches)
      rows.append([str(cores), "%.2fB" % (params / 1e9), label,
                   "%.3g" % cost.variable_bytes_per_processor,
                   "%.3g" % (2 * cost.variable_bytes_per_processor),
                   "%.3g" % cost.activation_bytes_per_processor,
                   "%.3g" % cost.comm_bytes_per_processor])
  print(common.machine_line())
  print("6 layers, d_model 1024, d_kv 128, vocab 32768, batch = cores, length 256, f32")
  common.print_table(rows)


if __name__ == "__main__":
  app.run(main)
