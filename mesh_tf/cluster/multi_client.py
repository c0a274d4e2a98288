"""Multi-client SPMD: every process of the cluster runs the mesh program for its own
devices, one replica per device, and the replicas meet in TF collective ops.

    # in each of N processes (task i), first thing, before TensorFlow makes devices:
    from mesh_tf.cluster import multi_client
    replicas = multi_client.ReplicaSet("batch:2;model:4", layout,
                                       "h0:2222,h1:2222", task=i)
    losses = replicas.run(lambda r, impl: step_fns[r](inputs, targets))

Processor p of the mesh is device p % k of task p // k (k = mesh size / N). The
processes are peers, each the gRPC server of its task (`enable_collective_ops`).
"""
import socket
import threading
import time

import tensorflow as tf
from tensorflow.core.protobuf import tensorflow_server_pb2
from tensorflow.python.eager import context

from mesh_tf import cpu_threads
from mesh_tf.backends.process_placement import ProcessPlacementMeshImpl, process_split
from mesh_tf.backends.simd_multi_client import DEFAULT_TIMEOUT, MultiClientMeshImpl
from mesh_tf.cluster import faults, host_threads, peer_monitor, spec
from mesh_tf.shapes import convert_to_shape

# A replica thread may take this long beyond the collective timeout before it is
# declared stuck (tracing on a loaded host).
JOIN_MARGIN = 120.0


def leader():
  """The collective group leader: task 0."""
  return "/job:%s/replica:0/task:0" % spec.JOB


def enable_collectives(addresses, task, devices_per_task, device_type="CPU"):
  """Makes this process task `task` of the cluster, able to run collectives with the
  others; returns the names of its devices_per_task local devices.

  Call before TensorFlow initializes (no tensors yet): for CPUs it splits the host CPU
  into devices_per_task virtual devices.
  """
  if not 0 <= task < len(addresses):
    raise spec.ClusterError("task %d is not an index of the %d processes %s"
                            % (task, len(addresses), ",".join(addresses)), task=task)
  if device_type.upper() == "CPU":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * devices_per_task)
  elif len(tf.config.list_physical_devices(device_type)) < devices_per_task:
    raise spec.ClusterError(
        "task %d needs %d %s devices (mesh size / processes) but has %d"
        % (task, devices_per_task, device_type,
           len(tf.config.list_physical_devices(device_type))), task=task)
  check_port_free(addresses[task], task)
  own = "/job:%s/task:%d" % (spec.JOB, task)
  ctx = context.context()
  ctx.configure_collective_ops(collective_leader=leader(), device_filters=(own,))
  config = ctx.config
  config.experimental.collective_group_leader = leader()
  del config.device_filters[:]
  config.device_filters.append(own)
  ctx.enable_collective_ops(tensorflow_server_pb2.ServerDef(
      cluster=spec.cluster_spec(addresses).as_cluster_def(), default_session_config=config,
      job_name=spec.JOB, task_index=task, protocol="grpc"))
  return ["/job:%s/replica:0/task:%d/device:%s:%d" % (spec.JOB, task, device_type, i)
          for i in range(devices_per_task)]


def check_port_free(address, task):
  """Raises a ClusterError naming the task and address when this process cannot
  listen on its own address (TF's gRPC server would fail without naming the port
  and leave the process unable to exit cleanly)."""
  host, _, port = address.rpartition(":")
  host = host.strip("[]")
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  probe = socket.socket(family, socket.SOCK_STREAM)
  try:
    probe.bind(("" if host in ("localhost", "0.0.0.0") else host, int(port)))
  except OSError as e:
    raise spec.ClusterError(
        "task %d cannot listen on its address %s: %s (is another process using port "
        "%s?)" % (task, address, e.strerror or e, port), task=task) from None
  finally:
    probe.close()


def wait_for_peers(addresses, task, timeout, poll=1.0, report_every=10.0):
  """Waits until every other task answers a health check, printing a line every
  report_every seconds; raises a ClusterError naming the first that did not within
  `timeout` seconds."""
  deadline = time.time() + timeout
  next_report = time.time() + report_every
  pending = [t for t in range(len(addresses)) if t != task]
  reason = None
  while pending:
    reason = peer_monitor.check_peer(pending[0], min(poll * 2, 5.0))
    if reason is None:
      pending.pop(0)
      continue
    if time.time() >= deadline:
      raise spec.ClusterError(
          "task %d (%s) did not answer within %.0f s (not started, or unreachable "
          "from task %d: %s); start it with the same command and TF_CONFIG index %d"
          % (pending[0], addresses[pending[0]], timeout, task, reason, pending[0]),
          task=pending[0])
    if time.time() >= next_report:
      print("task %d: waiting for task %d (%s) to start" % (
          task, pending[0], addresses[pending[0]]), flush=True)
      next_report = time.time() + report_every
    time.sleep(poll)


DISTRIBUTIONS = (None, "multi_worker_mirrored")


def multi_worker_strategy(addresses, task, devices_per_task, device_type="CPU",
                          communication_hint="auto"):
  """A tf.distribute.MultiWorkerMirroredStrategy over the cluster, for one replica per
  process (it also enables collective ops); returns (strategy, [its device])."""
  if devices_per_task != 1:
    raise spec.ClusterError(
        "distribution 'multi_worker_mirrored' runs one replica per process (its eager "
        "replicas would run one at a time and never meet in a collective), but the mesh "
        "puts %d processors on each of the %d processes; start mesh size processes, or "
        "use no distribution" % (devices_per_task, len(addresses)), task=task)
  if device_type.upper() != "CPU" and not tf.config.list_physical_devices(device_type):
    raise spec.ClusterError("task %d has no %s device" % (task, device_type), task=task)
  check_port_free(addresses[task], task)
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      spec.cluster_spec(addresses), task_type=spec.JOB, task_id=task, rpc_layer="grpc",
      num_accelerators={"GPU": 1} if device_type.upper() == "GPU" else None)
  implementation = {"nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
                    "ring": tf.distribute.experimental.CommunicationImplementation.RING
                   }.get(communication_hint,
                         tf.distribute.experimental.CommunicationImplementation.AUTO)
  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      cluster_resolver=resolver,
      communication_options=tf.distribute.experimental.CommunicationOptions(
          implementation=implementation))
  return strategy, list(strategy.extended.worker_devices)


def local_pnums(mesh_size, num_tasks, task):
  """The processors of task `task` (task-major: k consecutive pnums per task)."""
  if mesh_size % num_tasks:
    raise spec.ClusterError("a mesh of %d processors cannot be split evenly over %d "
                            "processes" % (mesh_size, num_tasks))
  k = mesh_size // num_tasks
  return list(range(task * k, (task + 1) * k))


PROGRAMS = ("auto", "per_process", "per_device")


def _runs_per_process(program, mesh_shape, pnums, device_type, distribution):
  """Whether the process runs its devices as one program (see ReplicaSet's `program`)."""
  if program not in PROGRAMS:
    raise spec.ClusterError("program %r: choose one of %s" % (program, ", ".join(PROGRAMS)))
  fits = process_split(mesh_shape, pnums) is not None
  if program == "per_process":
    if not fits or distribution is not None:
      raise spec.ClusterError(
          "program 'per_process' needs each process to hold a block of mesh %s "
          "(processors %s are not one)%s; use 'per_device'"
          % (mesh_shape.to_string, pnums, "" if distribution is None
             else " and no distribution"))
    return True
  return (program == "auto" and fits and len(pnums) > 1 and distribution is None
          and device_type.upper() == "CPU")


class ReplicaSet:
  """This process's replicas of a mesh program, run concurrently by `run`: one
  ProcessPlacementMeshImpl for all local devices, or one MultiClientMeshImpl per device.

  Args:
    mesh_shape, layout: the mesh and layout rules (the same in every process).
    cluster: the processes' addresses ("h:p,h:p", a list, TF_CONFIG-style dict).
    task: this process's index.
    device_type: "CPU" (virtual devices split out of the host CPU) or "GPU".
    timeout: seconds within which a lost (killed, stopped, unreachable) peer process
      is noticed by the peer monitor; the step in flight then fails naming it. 0 turns
      the monitor off (a lost peer then hangs the survivors).
    communication_hint: "auto", "ring" or "nccl" (GPUs).
    startup_timeout: seconds to wait for every peer process to start.
    distribution: None (this module's threads run the replicas) or
      "multi_worker_mirrored": the step runs through `strategy.run` of a
      tf.distribute.MultiWorkerMirroredStrategy (one replica per process).
    program: "per_process" (the process's devices run ONE placement program, see
      mesh_tf.backends.process_placement; needs each process's processors to be a
      block of the mesh, `process_split`), "per_device" (one replica per device) or
      "auto" (per process where it applies, on CPUs, without a distribution; else per
      device).
    threads: the cores this process's TensorFlow thread pools are sized for: "auto"
      (its share of the host's cores, mesh_tf.cluster.host_threads), a number, or 0
      (TensorFlow's own sizing).
  """

  def __init__(self, mesh_shape, layout, cluster, task, device_type="CPU",
               timeout=DEFAULT_TIMEOUT, communication_hint="auto", distribution=None,
               startup_timeout=300.0, program="auto", threads=host_threads.AUTO):
    self.addresses = spec.parse_addresses(cluster)
    self.task = task
    self.mesh_shape = convert_to_shape(mesh_shape)
    self.pnums = local_pnums(self.mesh_shape.size, len(self.addresses), task)
    self.timeout = float(timeout)
    self.per_process = _runs_per_process(program, self.mesh_shape, self.pnums,
                                         device_type, distribution)
    if distribution not in DISTRIBUTIONS:
      raise spec.ClusterError("distribution %r: choose None or 'multi_worker_mirrored'"
                              % (distribution,))
    self.strategy = None
    self.threads = cpu_threads.apply(host_threads.share(
        self.addresses, task, threads, len(self.pnums) if device_type.upper() == "CPU"
        else 0))
    if distribution is None:
      self.devices = enable_collectives(self.addresses, task, len(self.pnums),
                                        device_type)
    else:
      self.strategy, self.devices = multi_worker_strategy(
          self.addresses, task, len(self.pnums), device_type, communication_hint)
    self.startup_timeout = float(startup_timeout)
    wait_for_peers(self.addresses, task, startup_timeout)
    self.monitor = peer_monitor.PeerMonitor(self.addresses, task, self.timeout)
    self.monitor.start()
    if self.per_process:
      self.impls = [ProcessPlacementMeshImpl(self.mesh_shape, layout, self.pnums,
                                             self.devices, timeout, communication_hint)]
    else:
      self.impls = [MultiClientMeshImpl(self.mesh_shape, layout, p, d, self.pnums,
                                        timeout, communication_hint)
                    for p, d in zip(self.pnums, self.devices)]

  @property
  def program_summary(self):
    """What this process runs, in words: "4 replicas" or "processors 0-3 as one
    program"."""
    if self.per_process:
      return "processors %d-%d as one program" % (self.pnums[0], self.pnums[-1])
    return "%d replicas" % len(self.impls)

  @property
  def threads_summary(self):
    """The thread pools' sizes in words when this process set them ("; 1 thread per
    op, 1 op at once (2 processes share this host's 2 cores)"), else "".
    """
    return host_threads.describe(self.threads, self.addresses, self.task)

  @property
  def is_chief(self):
    """Whether this process writes checkpoints and reports (task 0)."""
    return self.task == 0

  def run(self, fn):
    """[fn(r, impl) for each local replica r], called concurrently, one thread each.

    A failure in any replica is raised (a lost peer process as a ClusterError naming
    it); a replica still running timeout + JOIN_MARGIN seconds later is reported stuck.
    """
    if self.strategy is not None:
      return self._run_on_strategy(fn)
    results = [None] * len(self.impls)
    errors = [None] * len(self.impls)

    def body(r):
      try:
        with tf.device(self.devices[r]):
          results[r] = fn(r, self.impls[r])
      except Exception as e:  # pylint: disable=broad-except
        errors[r] = e
    threads = [threading.Thread(target=body, args=(r,), daemon=True)
               for r in range(len(self.impls))]
    for t in threads:
      t.start()
    deadline = time.time() + self.timeout + JOIN_MARGIN
    for t in threads:
      t.join(max(0.0, deadline - time.time()))
    failed = [e for e in errors if e is not None]
    if failed or any(t.is_alive() for t in threads):
      lost = self.monitor.lost_error()
      if lost is not None:
        raise lost from (failed[0] if failed else None)
    if failed:
      lost = faults.lost_task_error(failed[0], self.addresses)
      if lost is not None:
        raise lost from failed[0]
      raise failed[0]
    if any(t.is_alive() for t in threads):
      context.context().abort_collective_ops(  # lets the stuck threads end
          tf.errors.DEADLINE_EXCEEDED, "task %d gave up waiting" % self.task)
      raise self.not_joined_error("a step's collectives did not complete",
                                  self.timeout + JOIN_MARGIN)
    return results

  def not_joined_error(self, what, seconds):
    """The ClusterError for collectives that none completes though every peer answers."""
    others = ", ".join("%d (%s)" % (t, a) for t, a in enumerate(self.addresses)
                       if t != self.task)
    return spec.ClusterError(
        "task %d: %s within %.0f s although every peer answers; a peer (task %s) is "
        "not running this SPMD program: started without cluster_setup.cluster_config."
        "mode = 'spmd', or with another configuration"
        % (self.task, what, seconds, others), task=self.task)

  def _run_on_strategy(self, fn):
    """fn(0, impl) of the one local replica, through strategy.run."""
    try:
      out = self.strategy.run(lambda: fn(0, self.impls[0]))
    except Exception as e:  # pylint: disable=broad-except
      lost = self.monitor.lost_error() or faults.lost_task_error(e, self.addresses)
      if lost is not None:
        raise lost from e
      raise
    return list(self.strategy.experimental_local_results(out))
