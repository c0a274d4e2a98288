"""Finding the TPU a notebook runs on: a Colab TPU runtime, a TPU VM, or none.

`TPUClusterResolver()` without arguments only reads `TPU_NAME`,
`KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS` or `TPU_CONFIG`; a Colab TPU runtime sets
`COLAB_TPU_ADDR` instead, and on a TPU VM the TPU is `tpu="local"`. `find_tpu` picks the
resolver's arguments, connects, and says which branch it took and why.
"""
import collections
import os

from mesh_tf.errors import LayoutError

TpuChoice = collections.namedtuple("TpuChoice", ["resolver_kwargs", "reason"])
TpuChoice.__doc__ = """What the environment says: the TPUClusterResolver arguments to try
(None: no TPU here) and why."""

TpuConnection = collections.namedtuple("TpuConnection",
                                       ["resolver", "topology", "branch", "reason"])
TpuConnection.__doc__ = """Result of find_tpu: resolver and topology (None on CPU), the
branch ("tpu" or "cpu") and a sentence saying why."""

# Set by TF's own TPU tooling; TPUClusterResolver() reads them itself.
RESOLVER_ENV_VARS = ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG")
# Signs of a TPU VM (the TPU is attached to this host).
TPU_VM_ENV_VARS = ("TPU_ACCELERATOR_TYPE", "COLAB_TPU_1VM")
TPU_VM_DEVICE = "/dev/accel0"


def choose_tpu(environ=None, path_exists=None):
  """The TPUClusterResolver arguments this environment calls for (a TpuChoice)."""
  environ = os.environ if environ is None else environ
  path_exists = path_exists or os.path.exists
  for name in RESOLVER_ENV_VARS:
    if environ.get(name):
      return TpuChoice({}, "%s=%s is set" % (name, environ[name]))
  if environ.get("COLAB_TPU_ADDR"):
    address = environ["COLAB_TPU_ADDR"]
    return TpuChoice({"tpu": "grpc://" + address},
                     "Colab TPU runtime (COLAB_TPU_ADDR=%s)" % address)
  for name in TPU_VM_ENV_VARS:
    if environ.get(name):
      return TpuChoice({"tpu": "local"}, "TPU VM (%s=%s)" % (name, environ[name]))
  device = TPU_VM_DEVICE  # read at call time (tests point it elsewhere)
  if path_exists(device):
    return TpuChoice({"tpu": "local"}, "TPU VM (%s exists)" % device)
  return TpuChoice(None, "no TPU in this environment (none of %s, COLAB_TPU_ADDR, %s or "
                   "%s)" % (", ".join(RESOLVER_ENV_VARS), ", ".join(TPU_VM_ENV_VARS), device))


def find_tpu(environ=None, path_exists=None, resolver_class=None,
             connect=None, initialize=None):
  """Connects to the TPU the environment names, if any; never raises for a missing TPU.

  Args:
    environ, path_exists: the environment and a file test (defaults: this process's).
    resolver_class, connect, initialize: TPUClusterResolver,
      tf.config.experimental_connect_to_cluster and
      tf.tpu.experimental.initialize_tpu_system by default (replaceable in tests).
  Returns:
    a TpuConnection; on the "cpu" branch its reason says why (no TPU here, or the error
    connecting raised).
  """
  choice = choose_tpu(environ, path_exists)
  if choice.resolver_kwargs is None:
    return TpuConnection(None, None, "cpu", choice.reason)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  resolver_class = resolver_class or tf.distribute.cluster_resolver.TPUClusterResolver
  connect = connect or tf.config.experimental_connect_to_cluster
  initialize = initialize or tf.tpu.experimental.initialize_tpu_system
  try:
    resolver = resolver_class(**choice.resolver_kwargs)
    connect(resolver)  # a no-op for tpu="local" (TF skips local masters)
    topology = initialize(resolver)
  except (ValueError, RuntimeError, tf.errors.OpError) as e:
    return TpuConnection(None, None, "cpu", "%s, but connecting with TPUClusterResolver(%s) "
                         "failed: %s: %s" % (choice.reason, _kwargs_text(choice),
                                             type(e).__name__, e))
  return TpuConnection(resolver, topology, "tpu", "%s; TPUClusterResolver(%s)"
                       % (choice.reason, _kwargs_text(choice)))


def _kwargs_text(choice):
  return ", ".join("%s=%r" % kv for kv in sorted(choice.resolver_kwargs.items()))


def mesh_shape_for_cores(num_cores):
  """A "rows:R;cols:C" mesh over num_cores: two rows when the count is even and >= 4."""
  num_cores = int(num_cores)
  if num_cores < 1:
    raise LayoutError("a mesh needs at least one core, got %d" % num_cores)
  rows = 2 if num_cores >= 4 and num_cores % 2 == 0 else 1
  return "rows:%d;cols:%d" % (rows, num_cores // rows)
