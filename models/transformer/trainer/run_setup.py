"""What every trainer mode needs first: devices, the MeshImpl, seeds, batched data, gin IO.

The mesh is emulated on virtual CPU devices: a placement mesh of n processors needs n
logical devices, fixed before TensorFlow runs its first op. SIMD emulation and GSPMD
run on one device whatever the mesh size.
"""
import numbers
import os
import random
import uuid

import gin
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import LayoutError, MtfError
from models.transformer import model_graph


def configured_backend():
  """The gin binding of make_mesh_impl.backend, or "placement" when unbound."""
  try:
    return gin.query_parameter("make_mesh_impl.backend")
  except ValueError:
    return "placement"


def mesh_devices(mesh_size, backend):
  """Device names for a mesh of mesh_size processors on the given backend: for
  placement, one logical CPU per processor, made if TensorFlow has not started yet
  (else the first mesh_size existing ones)."""
  if backend != "placement":
    return None
  if mesh_size == 1:
    return [""]
  try:
    return mtf.utils.configure_virtual_cpus(mesh_size)
  except LayoutError:
    have = len(tf.config.list_logical_devices("CPU"))
    if have < mesh_size:
      raise LayoutError(
          "mesh of %d processors needs %d CPU devices for the placement backend, but "
          "TensorFlow already started with %d; run in a fresh process, or set "
          "make_mesh_impl.backend = 'simd'" % (mesh_size, mesh_size, have)) from None
    return ["/cpu:%d" % i for i in range(mesh_size)]


def make_mesh_impl(mesh_layout, devices=None):
  """A MeshImpl of the gin-configured backend (placement by default) laying tensors
  out by mesh_layout (a MeshLayout), on devices (by default the cluster's, else this
  process's)."""
  backend = configured_backend()
  from models.transformer.trainer import cluster_setup  # pylint: disable=g-import-not-at-top
  if devices is None:
    devices = cluster_setup.mesh_devices(mesh_layout.shape, backend)  # None: one process
  if devices is None:
    devices = mesh_devices(mesh_layout.size, backend)
  return mtf.make_mesh_impl(mesh_shape=mesh_layout, layout=None, devices=devices)


def device_count(mesh_shape):
  """The device count utils.run.mesh_shape gives (e.g. 8 or "8"), else None."""
  if isinstance(mesh_shape, int) or (isinstance(mesh_shape, str)
                                     and mesh_shape.strip().isdigit()):
    return int(mesh_shape)
  return None


def _fix_lengths(sequence_length):
  """A map function that casts features to int32 and pads/trims them to their length."""
  def fix(example):
    out = {}
    for key, value in example.items():
      if key not in model_graph.FEATURE_KEYS:
        continue
      length = model_graph.feature_length(sequence_length, key)
      value = tf.cast(value, tf.int32)[:length]
      out[key] = tf.pad(value, [[0, length - tf.shape(value)[0]]])
      out[key].set_shape([length])
    return out
  return fix


def example_stream(dataset_fn, sequence_length, vocabulary, dataset_split, repeat=True):
  """dataset_fn's examples as fixed-length int32 feature dicts, repeated unless not.
  Build a run's train stream before anything else draws op seeds, so its unseeded
  shuffles get the same op seeds (from utils.run.seed) in every mode."""
  if dataset_fn is None:
    raise MtfError("no dataset function for split %r: bind utils.run.train_dataset_fn "
                   "(or eval_dataset_fn) in gin" % dataset_split)
  try:
    dataset = dataset_fn(sequence_length=sequence_length, vocabulary=vocabulary,
                         dataset_split=dataset_split)
  except (FileNotFoundError, tf.errors.NotFoundError) as e:
    raise MtfError("dataset for split %r: data file not found: %s" % (dataset_split, e),
                   file=getattr(e, "filename", None)) from e
  dataset = dataset.map(_fix_lengths(sequence_length))
  return dataset.repeat() if repeat else dataset


def batched_dataset(dataset_fn, sequence_length, vocabulary, dataset_split, batch_size,
                    repeat=True):
  """dataset_fn's examples as fixed-shape int32 [batch_size, length] feature dicts."""
  examples = example_stream(dataset_fn, sequence_length, vocabulary, dataset_split,
                            repeat)
  return examples.batch(batch_size, drop_remainder=True).prefetch(2)


def order_is_seeded():
  """Whether TensorFlow's global seed is set (utils.run.seed not None), so shuffles
  without an op seed replay the same order in a new process."""
  if _last_seed:
    return _last_seed[-1] is not None
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  return context.global_seed() is not None


def resume_skip_line(steps, batch_size):
  """The line a run resumed at global step `steps` prints about its input: every step
  consumed one global batch, which the new input pipeline skips."""
  line = ("the input pipeline skips the %d batches (%d examples) it already trained on"
          % (steps, steps * batch_size))
  if not order_is_seeded():
    line += ("; utils.run.seed is None, so the order of a shuffled pipeline is not "
             "reproducible: the batches after the skip may differ from the stopped run's")
  return line


def skip_trained_batches(batches, steps, batch_size):
  """batches (a run's global batches from the start of its data) after the first
  `steps`, which the steps before global step `steps` trained on; says so if any."""
  if not steps:
    return batches
  print(resume_skip_line(steps, batch_size), flush=True)
  return batches.skip(steps)


def feature_keys(dataset):
  """The feature names of a (batched) dataset."""
  return sorted(dataset.element_spec)


def next_batch(iterator, dataset_split):
  """The next batch; a missing or unreadable data file becomes an MtfError (the end of
  the data stays StopIteration)."""
  try:
    return next(iterator)
  except tf.errors.NotFoundError as e:
    raise MtfError("dataset for split %r: data file not found: %s"
                   % (dataset_split, e.message)) from e


def write_text_atomically(path, text):
  """Writes text to path through a temporary file and a rename."""
  directory = os.path.dirname(path) or "."
  tf.io.gfile.makedirs(directory)
  tmp = os.path.join(directory, ".%s.tmp-%s" % (os.path.basename(path), uuid.uuid4().hex))
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write(text)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def _run_bindings():
  """The "# Parameters for run:" block of gin's bindings (gin lists a configurable as
  operative only once it returns, and utils.run is still running)."""
  text = gin.config_str()
  start = text.find("# Parameters for run:")
  if start < 0:
    return ""
  end = text.find("\n\n", start)
  return text[start:] if end < 0 else text[start:end + 1]


def write_operative_config(model_dir, extra=""):
  """Writes gin's operative config (what the run actually used), then extra (e.g. the
  auto layout's bindings), to model_dir."""
  text = gin.operative_config_str()
  if "# Parameters for run:" not in text:
    text = text.rstrip("\n") + "\n\n" + _run_bindings()
  text += extra
  write_text_atomically(os.path.join(model_dir, "operative_config.gin"), text)


_last_seed = []  # the seed of the last seed_everything call (for resume_skip_line)


def seed_everything(seed):
  """Seeds TensorFlow's global random state (the initializers' and tf.data shuffles'
  op seeds derive from it), Python's `random` and numpy; None leaves all unseeded."""
  _last_seed[:] = [seed]
  if seed is None:
    return
  seed = int(seed)
  tf.random.set_seed(seed)
  random.seed(seed)
  np.random.seed(seed % (2 ** 32))


def _fail(name, value, allowed):
  raise MtfError("utils.run.%s = %r is not allowed: %s" % (name, value, allowed))


def _whole(name, value, minimum, allow_none=False):
  """value as an int >= minimum, else a one-line MtfError naming utils.run.<name>."""
  if value is None and allow_none:
    return None
  integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
  if not (integral or isinstance(value, float) and value.is_integer()) or value < minimum:
    _fail(name, value, "it must be a whole number >= %d" % minimum)
  return int(value)


def check_train_steps(train_steps):
  """train_steps as an int >= 0, else a one-line MtfError."""
  return _whole("train_steps", train_steps, 0)


def check_run_parameters(model_dir, train_steps, save_checkpoints_steps,
                         iterations_per_loop, keep_checkpoint_max, eval_steps,
                         sequence_length, mesh_shape, auto_layout=False):
  """Checks utils.run's values before anything is built (a one-line MtfError naming the
  bad parameter); returns (train_steps, save_checkpoints_steps, iterations_per_loop,
  eval_steps) as ints (eval_steps may be None). With auto_layout, mesh_shape may be a
  device count."""
  if not model_dir or not isinstance(model_dir, (str, os.PathLike)):
    _fail("model_dir", model_dir, "give a directory with --model_dir (or bind "
          "utils.run.model_dir)")
  if not callable(train_steps):  # else computed once the batch size is known
    train_steps = check_train_steps(train_steps)
  save_checkpoints_steps = _whole("save_checkpoints_steps", save_checkpoints_steps, 1)
  iterations_per_loop = _whole("iterations_per_loop", iterations_per_loop, 1)
  _whole("keep_checkpoint_max", keep_checkpoint_max, 1, allow_none=True)
  eval_steps = _whole("eval_steps", eval_steps, 0, allow_none=True)
  lengths = sequence_length if isinstance(sequence_length, dict) else {"": sequence_length}
  for key, length in lengths.items():
    _whole("sequence_length" + ("[%r]" % key if key else ""), length, 1)
  if device_count(mesh_shape) is not None:
    if not auto_layout:
      _fail("mesh_shape", mesh_shape, "a device count needs utils.run.layout_rules = "
            "'auto'; otherwise give the mesh as 'name:size;...'")
    _whole("mesh_shape", int(mesh_shape), 1)
    mesh_shape = ""
  for dim in mtf.convert_to_shape(mesh_shape).dims:
    if dim.size < 1:
      _fail("mesh_shape", mesh_shape, "mesh dim %r has size %d; every mesh dim needs "
            "at least 1 processor" % (dim.name, dim.size))
  return train_steps, save_checkpoints_steps, iterations_per_loop, eval_steps
