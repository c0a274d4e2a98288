"""Runs TF-exported HLO through XLA's SPMD partitioner on N host CPU devices (via jaxlib).

TensorFlow does not partition on CPU; jaxlib's XLA client does. Run as a separate process
(TF and jax each bring their own XLA):

    python partition_with_jax.py NUM_DEVICES CASE_DIR [CASE_DIR ...]

Each CASE_DIR holds `module.pb` (experimental_get_compiler_ir(...)(stage="hlo_serialized"))
and `inputs.npz` (arg_0, arg_1, ... in HLO parameter order). This script converts the
module to StableHLO, compiles it for NUM_DEVICES partitions with SPMD partitioning, cuts
each argument into the shards the compiled program asks for, runs it, reassembles the
outputs, and writes to CASE_DIR:
  outputs.npz      out_0, out_1, ...: the reassembled global outputs;
  report.json      per parameter: its sharding and the shard shape each device received;
                   per output: each device's shard shape; the partitioned module's
                   collectives (kind, bytes of the result) and entry parameter shapes;
  partitioned.txt  the partitioned HLO module's text.
"""
import json
import os
import re
import sys


def _configure(num_devices):
  flags = os.environ.get("XLA_FLAGS", "")
  os.environ["XLA_FLAGS"] = (
      flags + " --xla_force_host_platform_device_count=%d" % num_devices).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%[\w.\-]+ = (.+?) (all-reduce|all-gather|collective-permute|all-to-all|"
    r"reduce-scatter)(?:-start)?\(")
_ARRAY_TYPE = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "f16": 2, "bf16": 2, "f64": 8, "s64": 8}


def _collectives(text):
  out = []
  for line in text.splitlines():
    match = _COLLECTIVE.match(line)
    if match:
      size = 0
      for dtype, dims in _ARRAY_TYPE.findall(match.group(1)):
        count = 1
        for d in dims.split(","):
          count *= int(d) if d else 1
        size += count * _BYTES.get(dtype, 4)
      out.append({"kind": match.group(2), "bytes": size})
  return out


def _entry_parameter_shapes(text):
  """Shape of each ENTRY parameter of a module's text (per device, once partitioned)."""
  entry = text[text.index("\nENTRY"):]
  shapes = {}
  for match in re.finditer(r"= [a-z]+\d*\[([\d,]*)\]\S* parameter\((\d+)\)", entry):
    shapes[int(match.group(2))] = [int(d) for d in match.group(1).split(",") if d]
  return [shapes[i] for i in sorted(shapes)]


def run_case(case_dir, num_devices):
  """Partitions, runs and reports one exported module (see the module docstring)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  from jax._src.lib import _jax, xla_client  # pylint: disable=g-import-not-at-top
  from jax._src.sharding_impls import GSPMDSharding  # pylint: disable=g-import-not-at-top

  with open(os.path.join(case_dir, "module.pb"), "rb") as f:
    stablehlo = _jax.mlir.hlo_to_stablehlo(f.read())
  inputs = np.load(os.path.join(case_dir, "inputs.npz"))
  args = [inputs["arg_%d" % i] for i in range(len(inputs.files))]

  devices = jax.devices()[:num_devices]
  options = xla_client.CompileOptions()
  options.num_replicas = 1
  options.num_partitions = num_devices
  build = options.executable_build_options
  build.num_replicas = 1
  build.num_partitions = num_devices
  build.use_spmd_partitioning = True
  # Outputs aliased to variables keep the variables' sharding instead of being gathered.
  build.allow_spmd_sharding_propagation_to_output = [True]
  build.device_assignment = xla_client.DeviceAssignment.create(
      np.arange(num_devices).reshape(1, num_devices))
  backend = xla_bridge.get_backend("cpu")
  executable = backend.compile_and_load(stablehlo, xla_client.DeviceList(tuple(devices)),
                                        options)
  partitioned = executable.hlo_modules()[0].to_string()

  report = {"parameters": [], "outputs": []}
  arrays = []
  for value, op_sharding in zip(args, executable.get_parameter_shardings()):
    sharding = GSPMDSharding(devices, op_sharding)
    index_of = sharding.devices_indices_map(value.shape)
    shards = [jax.device_put(value[index_of[d]], d) for d in devices]
    arrays.append(jax.make_array_from_single_device_arrays(value.shape, sharding, shards))
    report["parameters"].append({
        "sharding": str(xla_client.HloSharding.from_proto(op_sharding)),
        "shard_shapes": [list(s.shape) for s in shards]})

  results = executable.execute_sharded(arrays)
  per_device = results.disassemble_into_single_device_arrays()
  outputs = {}
  for i, (shards, op_sharding) in enumerate(zip(per_device,
                                                executable.get_output_shardings())):
    sharding = GSPMDSharding(devices, op_sharding)
    local = [np.asarray(s) for s in shards]
    shape = _global_shape(op_sharding, local[0].shape)
    full = np.zeros(shape, local[0].dtype)
    for d, piece in zip(devices, local):
      full[sharding.devices_indices_map(shape)[d]] = piece
    outputs["out_%d" % i] = full
    report["outputs"].append({"shard_shapes": [list(p.shape) for p in local]})

  report["collectives"] = _collectives(partitioned)
  report["entry_parameter_shapes"] = _entry_parameter_shapes(partitioned)
  np.savez(os.path.join(case_dir, "outputs.npz"), **outputs)
  with open(os.path.join(case_dir, "report.json"), "w") as f:
    json.dump(report, f)
  with open(os.path.join(case_dir, "partitioned.txt"), "w") as f:
    f.write(partitioned)


def _global_shape(op_sharding, shard_shape):
  """The full shape of an output: its shard's extent times the tile count on each axis."""
  rank = len(shard_shape)
  tiles = list(op_sharding.tile_assignment_dimensions)[:rank]
  if len(tiles) < rank:  # replicated (or maximal): every device holds the whole value
    tiles = [1] * rank
  return tuple(s * t for s, t in zip(shard_shape, tiles))


def main(argv):
  num_devices = int(argv[1])
  _configure(num_devices)
  for case_dir in argv[2:]:
    run_case(case_dir, num_devices)


if __name__ == "__main__":
  main(sys.argv)
