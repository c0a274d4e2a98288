"""The trainer on several processes: where the cluster comes from, and each role.

    # on every worker host (task i of N):
    TF_CONFIG='{"cluster": {"worker": ["h0:2222", "h1:2222"]},
                "task": {"type": "worker", "index": i}}' \\
        python -m models.transformer.main --gin_file=...      # serves, never returns
    # on the chief (the single client: builds the program, reads data, checkpoints):
    TF_CONFIG='{... "task": {"type": "chief", "index": 0}}' \\
        python -m models.transformer.main --gin_file=... --mode=train

or, instead of TF_CONFIG, `--cluster=h0:2222,h1:2222` on the chief and
`python -m mesh_tf.cluster.worker --cluster=... --task=i --virtual_cpus=k` on workers.
The placement mesh is laid over all workers' devices, task-major; only the chief
writes checkpoints (full-shape and name-based, so they restore on any mesh).
"""
import contextlib

import gin

from mesh_tf import cluster as cluster_lib
from mesh_tf.cluster import host_threads, multi_client, spec

JOB_WORKER = spec.JOB  # the TF_CONFIG task type of a worker
# Set by configure(): the worker addresses of this run, or None for one process.
_state = {"addresses": None, "device_type": "CPU", "timeout": 10.0, "replicas": None,
          "strategy": None}
MODES = ("placement", "spmd")
SPMD_PROGRAMS = multi_client.PROGRAMS


@gin.configurable(module="cluster_setup")
def cluster_config(cluster=None, device_type="CPU", connect_timeout=10.0,
                   mode="placement", collective_timeout=60.0, communication_hint="auto",
                   distribution=None, startup_timeout=300.0, spmd_program="auto",
                   threads_per_process="auto"):
  """gin: the cluster (worker addresses "h:p,h:p"; None: TF_CONFIG or one process), the
  device type the mesh uses on the workers, seconds to wait for each worker, the mode
  ("placement": one chief drives workers; "spmd": every process trains its own
  replicas), seconds within which an SPMD process notices a lost peer (0: never), the
  SPMD collectives' implementation ("auto", "ring", or "nccl" on GPUs), the
  distribution (None; in SPMD mode "multi_worker_mirrored", one replica per process;
  in one process "tpu", through TPUStrategy.run, untested here), the seconds an
  SPMD process waits for every peer to start, what an SPMD process runs
  (multi_client.ReplicaSet's `program`: "auto", "per_process" or "per_device"), and the
  size of each process's TensorFlow thread pools ("auto": its share of the host's cores
  when several processes of the cluster share a host; a number; 0: TensorFlow's own;
  see mesh_tf.cluster.host_threads)."""
  if mode not in MODES:
    raise cluster_lib.ClusterError("cluster_config.mode = %r; choose one of %s"
                                   % (mode, ", ".join(MODES)))
  if spmd_program not in SPMD_PROGRAMS:
    raise cluster_lib.ClusterError("cluster_config.spmd_program = %r; choose one of %s"
                                   % (spmd_program, ", ".join(SPMD_PROGRAMS)))
  host_threads.checked(threads_per_process)
  return (cluster, device_type, float(connect_timeout), mode, float(collective_timeout),
          communication_hint, distribution, float(startup_timeout), spmd_program,
          threads_per_process)


def configure(cluster_flag=None):
  """Decides this process's role from --cluster, gin and TF_CONFIG; returns
  ("single" | "chief" | "worker", worker addresses or None, task index)."""
  cluster, device_type, timeout = cluster_config()[:3]
  cluster = cluster_flag or cluster
  _state.update(device_type=device_type, timeout=timeout)
  if cluster:
    _state["addresses"] = cluster_lib.parse_addresses(cluster)
    return "chief", _state["addresses"], 0
  addresses, task_type, index = cluster_lib.from_tf_config() or (None, "single", 0)
  _state["addresses"] = addresses
  return task_type, addresses, index


def addresses():
  """The configured worker addresses, or None when the run is one process."""
  return _state["addresses"]


def serve(addresses_, task, mesh_shape):
  """Runs this process as worker `task`, with its share of the mesh's devices."""
  from mesh_tf.cluster import server as server_lib  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  size = mtf.convert_to_shape(mesh_shape).size
  if size % len(addresses_):
    raise cluster_lib.ClusterError(
        "mesh %s of %d processors cannot be split evenly over %d workers"
        % (mtf.convert_to_shape(mesh_shape).to_string, size, len(addresses_)))
  server_lib.serve(addresses_, task, size // len(addresses_), cluster_config()[9])


def mesh_devices(mesh_shape, backend):
  """The mesh's devices on the cluster (connecting to it), or None for one process."""
  if _state["addresses"] is None:
    return None
  if backend != "placement":
    raise cluster_lib.ClusterError(
        "a cluster run needs make_mesh_impl.backend = 'placement' (got %r)" % (backend,))
  devices = cluster_lib.connect(_state["addresses"], mesh_shape, _state["device_type"],
                                _state["timeout"])
  print("mesh laid over %d devices of %d worker tasks (%s)"
        % (len(devices), len(_state["addresses"]), ",".join(_state["addresses"])),
        flush=True)
  return devices


def spmd_replicas():
  """This process's ReplicaSet in an SPMD cluster run, else None."""
  return _state["replicas"]


def claims_model_dir():
  """Whether this process holds model_dir's lock: all but the non-chief SPMD peers."""
  replicas = _state["replicas"]
  return replicas is None or replicas.is_chief


def run_spmd(addresses_, task, run_fn):
  """Every process of an SPMD run: makes its replicas (before TF makes its devices),
  then runs run_fn (utils.run, which trains them through spmd_train_loop)."""
  if not addresses_:
    raise cluster_lib.ClusterError(
        "cluster_config.mode = 'spmd' needs the cluster: set TF_CONFIG (task type "
        "'worker', index i) in every process, or --cluster on task 0")
  if _bound("utils.run.mode", "train") != "train":
    raise cluster_lib.ClusterError("cluster_config.mode = 'spmd' runs --mode=train only; "
                                   "eval and decode run in one process on the "
                                   "checkpoints")
  (_, device_type, _, _, collective_timeout, hint, distribution,
   startup_timeout, program, threads) = cluster_config()
  replicas = _state["replicas"] = multi_client.ReplicaSet(
      _bound("utils.run.mesh_shape", ""), _bound("utils.run.layout_rules", ""),
      addresses_, task, device_type=device_type, timeout=collective_timeout,
      communication_hint=hint, distribution=distribution,
      startup_timeout=startup_timeout, program=program, threads=threads)
  print("task %d of %d: %s of mesh %s on %s%s%s; %s" % (
      task, len(addresses_), replicas.program_summary, replicas.mesh_shape.to_string,
      addresses_[task], replicas.threads_summary,
      ", steps through strategy.run of MultiWorkerMirroredStrategy"
      if replicas.strategy else "",
      spec.TRUST_NOTE % addresses_[task].rpartition(":")[2]), flush=True)
  try:
    return run_fn()
  finally:
    replicas.monitor.stop()
    _state["replicas"] = None


def run_in_role(cluster_flag, run_fn):
  """Runs this process's role: a worker serves (never returns); the chief runs run_fn
  with a lost worker reported as a ClusterError naming it; one process runs run_fn.
  In SPMD mode every process runs run_fn on its own replicas (run_spmd)."""
  role, addresses_, task = configure(cluster_flag)
  if cluster_config()[3] == "spmd":
    return run_spmd(addresses_, task, run_fn)
  if role == JOB_WORKER:
    return serve(addresses_, task, _bound("utils.run.mesh_shape", ""))
  if addresses_:
    with cluster_lib.raise_lost_task(addresses_, has_checkpoint=_has_checkpoint):
      return run_fn()
  return run_fn()


def _has_checkpoint():
  """Whether the run's model_dir holds a checkpoint to resume from."""
  from mesh_tf.checkpoint import discovery  # pylint: disable=g-import-not-at-top
  model_dir = _bound("utils.run.model_dir", None)
  return bool(model_dir and discovery.find_checkpoints(model_dir).checkpoints)


def _bound(name, default):
  """gin's binding of name, or default when it is unbound."""
  try:
    return gin.query_parameter(name)
  except ValueError:
    return default


def tpu_strategy(mesh_size):
  """(TPUStrategy, DeviceAssignment) on the TPU the environment names, replica r on
  core r of mesh_size cores. Untested here: no TPU."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tf.backends import simd_tpu, tpu_detection  # pylint: disable=g-import-not-at-top
  found = tpu_detection.find_tpu()
  if found.branch != "tpu":
    raise cluster_lib.ClusterError("cluster_config.distribution = 'tpu' but %s"
                                   % found.reason)
  assignment = simd_tpu.device_assignment_for_mesh(found.topology, mesh_size)
  return (tf.distribute.TPUStrategy(found.resolver,
                                    experimental_device_assignment=assignment),
          assignment)


# distribution -> fn(mesh size) -> (strategy, device assignment); tests put stand-ins here
STRATEGY_FACTORIES = {"tpu": tpu_strategy}


def strategy_mesh_impl(mesh_layout):
  """With cluster_config.distribution = 'tpu' (one process): a SimdMeshImpl laying
  tensors out by mesh_layout on the strategy's cores (its TPU runtime), else None."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  distribution = cluster_config()[6]
  if distribution != "tpu" or _state["replicas"] is not None:
    return None
  _state["strategy"], assignment = STRATEGY_FACTORIES[distribution](mesh_layout.size)
  return mtf.SimdMeshImpl(mesh_layout, None, device_assignment=assignment)


def _strategy_of(mesh_impl):
  """The strategy a mesh impl runs under (SimdMeshImpl's TPU runtime), or None."""
  if getattr(mesh_impl, "is_emulated", True):  # not a SimdMeshImpl on TPU cores
    return None
  if _state["strategy"] is None:
    raise cluster_lib.ClusterError("a SimdMeshImpl with a device assignment lowers inside "
                                   "strategy.run; set cluster_config.distribution = 'tpu'")
  return _state["strategy"]


def variable_scope(mesh_impl):
  """Where the trainer creates mesh_impl's variables: its strategy's scope, if any."""
  strategy = _strategy_of(mesh_impl)
  return contextlib.nullcontext() if strategy is None else strategy.scope()


def run_replicated(mesh_impl, fn, *args):
  """fn(*args), or, on a strategy's mesh, fn on every core through strategy.run (the
  first core's result: the trainer's fn returns the replicated loss)."""
  strategy = _strategy_of(mesh_impl)
  if strategy is None:
    return fn(*args)
  return strategy.experimental_local_results(strategy.run(fn, args=args))[0]
