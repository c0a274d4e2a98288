"""Hardware profiles: the numbers that turn predicted FLOPs and bytes into seconds.

A profile is data (a namedtuple), selectable by name or by gin (`@auto_mtf.TPU_V2`, or
`choose_layout.profile = 'tpu_v3'`). Rates are per device (one TPU core, one GPU, one
emulated CPU device). The numbers are rounded public peak figures, so predicted step
times rank layouts; they do not promise wall-clock times.

- Compute time of a step: FLOPs per device / `flops_per_second`.
- Time of one collective: `collective_latency_s` + bytes each device sends / the
  bandwidth of its mesh axes. A mesh axis whose devices all lie in one group of
  `fast_group_size` consecutive devices (row-major device order, e.g. the GPUs of one
  node) runs at `fast_group_bandwidth`; any other at `link_bandwidth`. A collective over
  several mesh axes runs at the slowest of them.
"""
import collections
import math

import gin

from mesh_tf.errors import MtfError

_GIB = 1 << 30


class HardwareProfile(collections.namedtuple("HardwareProfile", [
    "name", "flops_per_second", "memory_bytes", "collective_latency_s",
    "link_bandwidth", "fast_group_size", "fast_group_bandwidth"])):
  """Per-device compute rate, memory, collective latency and bandwidths (bytes/s)."""

  def axis_bandwidth(self, mesh_sizes, axes):
    """Bytes/s each device sends along mesh `axes` of a mesh with `mesh_sizes`."""
    bandwidth = None
    for a in axes:
      span = math.prod(mesh_sizes[a:])
      fast = (self.fast_group_size and span <= self.fast_group_size
              and self.fast_group_size % span == 0)
      b = self.fast_group_bandwidth if fast else self.link_bandwidth
      bandwidth = b if bandwidth is None else min(bandwidth, b)
    return bandwidth or self.link_bandwidth

  @property
  def is_axis_uniform(self):
    """True when every mesh axis has the same bandwidth (mesh dims can be reordered)."""
    return not self.fast_group_size or self.fast_group_bandwidth == self.link_bandwidth


# TPU v2: 45 TFLOP/s (bf16) and 16 GiB HBM per chip of 2 cores; inter-chip links of
# about 62 GB/s each way (496 Gbit/s). TPU v3: 123 TFLOP/s, 32 GiB, 82 GB/s links.
TPU_V2 = HardwareProfile("tpu_v2", 22.5e12, 8 * _GIB, 5e-6, 62e9, 0, 0.0)
TPU_V3 = HardwareProfile("tpu_v3", 61.5e12, 16 * _GIB, 5e-6, 82e9, 0, 0.0)
# NVIDIA H100 SXM: ~990 TFLOP/s dense bf16, 80 GB; NVLink 450 GB/s each way among the 8
# GPUs of a node, InfiniBand 400 Gbit/s (50 GB/s) per GPU between nodes.
GPU_H100 = HardwareProfile("gpu_h100", 990e12, 80 * 10**9, 10e-6, 50e9, 8, 450e9)
# This development host: 2 x86-64 cores shared by the emulated devices (~25 GFLOP/s
# each in float32), 24 GiB split 8 ways, memcpy-speed "links", and the few tens of
# microseconds TensorFlow spends dispatching one collective's ops.
CPU_HOST = HardwareProfile("cpu_host", 25e9, 3 * _GIB, 50e-6, 5e9, 0, 0.0)

PROFILES = collections.OrderedDict(
    (p.name, p) for p in (TPU_V2, TPU_V3, GPU_H100, CPU_HOST))

for _p in PROFILES.values():
  gin.constant("auto_mtf.%s" % _p.name.upper(), _p)


@gin.configurable(module="auto_mtf")
def hardware_profile(name="tpu_v2", **overrides):
  """The profile called `name` (see PROFILES), with fields replaced by `overrides`.

  Args:
    name: a key of PROFILES, or a HardwareProfile (returned with overrides applied).
    **overrides: HardwareProfile fields to replace, e.g. memory_bytes=4 << 30.

  Raises:
    MtfError naming the known profiles when `name` is unknown.
  """
  if isinstance(name, HardwareProfile):
    profile = name
  elif name in PROFILES:
    profile = PROFILES[name]
  else:
    raise MtfError("unknown hardware profile %r; known profiles: %s"
                   % (name, ", ".join(PROFILES)))
  return profile._replace(**overrides) if overrides else profile
