"""Loads TensorFlow Datasets by name from data already on disk; never downloads.

Failures (package missing, unknown name, data not prepared, split missing) become an
`MtfError` naming the dataset, the directory and what to do.
"""
from mesh_tf import errors

_PREPARE_HINT = ("prepare it first on a machine with internet access (tfds.builder(%r, "
                 "data_dir=%r).download_and_prepare()) and copy the folder here; "
                 "mesh_tf never downloads")


def _import_tfds():
  """Imports tensorflow_datasets, or says how to install it."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.MtfError("TFDS datasets need the 'tensorflow-datasets' package",
                          hint="pip install -e .[data]") from e
  return tfds


def on_disk_builder(dataset_name, data_dir):
  """The TFDS builder of dataset_name whose prepared data is under data_dir."""
  tfds = _import_tfds()
  try:
    builder = tfds.builder(dataset_name, data_dir=data_dir)
  except Exception as e:  # DatasetNotFoundError, bad config names, ...
    raise errors.MtfError(
        "TFDS dataset %r cannot be built (data_dir %r): %s"
        % (dataset_name, data_dir, str(e).splitlines()[0]), file=data_dir,
        hint="check the name (e.g. 'lm1b' or 'wmt14_translate/de-en')") from e
  if not builder.is_prepared():
    raise errors.MtfError(
        "TFDS dataset %r has no prepared data under data_dir %r"
        % (dataset_name, data_dir or "~/tensorflow_datasets"), file=data_dir,
        hint=_PREPARE_HINT % (dataset_name, data_dir))
  return builder


def split_name(builder, dataset_split):
  """Maps "train"/"validation"/"eval"/"test" onto a split the dataset has."""
  available = list(builder.info.splits.keys())
  candidates = {"train": ["train"],
                "validation": ["validation", "test"],
                "eval": ["validation", "test"],
                "test": ["test", "validation"]}.get(dataset_split, [dataset_split])
  for name in candidates:
    if name in available:
      return name
  raise errors.MtfError(
      "TFDS dataset %r has no split for %r (it has %s)"
      % (builder.name, dataset_split, ", ".join(sorted(available))))


def load_tfds(dataset_name, dataset_split, tfds_data_dir=None, as_supervised=True,
              shuffle_files=False):
  """tf.data.Dataset of a prepared TFDS dataset split; raises MtfError if absent."""
  builder = on_disk_builder(dataset_name, tfds_data_dir)
  split = split_name(builder, dataset_split)
  return builder.as_dataset(split=split, as_supervised=as_supervised,
                            shuffle_files=shuffle_files)
