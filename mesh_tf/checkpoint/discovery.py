"""Finding the checkpoints of a directory, even when its `checkpoint` state file is lost.

The state file is a convenience, not the truth: a checkpoint exists when its `.index`
file and all its data shards do (saves rename the index last). So the rule every mode
uses is: the complete checkpoints the state file lists, plus any complete checkpoint
newer than those; when the state file is missing, empty, garbled or binary, every
complete `<basename>-<step>` found by scanning the directory. Each departure from the
plain state file is described in one line for the caller to print.
"""
import collections
import os
import re
import time

import tensorflow as tf

from mesh_tf.checkpoint import files
from mesh_tf.errors import CheckpointError

_DATA = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
_TEMPORARY = re.compile(r"^\..+\.tmp-[0-9a-f]{32}")  # files.write_bundle / write_state
_LOOKS = 4  # how often a listing disturbed by a concurrent save or prune is retried
_LOOK_PAUSE_SECS = 0.02
Found = collections.namedtuple("Found", ["checkpoints", "note", "state_ok"])
Found.__doc__ = """What find_checkpoints saw: complete checkpoint prefixes, oldest first;
a line saying how they differ from the state file (None if it is fine and complete); and
whether the state file needs no rewrite."""


def is_complete(prefix):
  """Whether prefix has its .index file and every data shard the shard names promise."""
  if not tf.io.gfile.exists(files.index_file(prefix)):
    return False
  shards = files.data_files(prefix)
  if not shards:
    return False
  total = int(_DATA.search(shards[0]).group(2))
  have = {int(_DATA.search(s).group(1)) for s in shards
          if int(_DATA.search(s).group(2)) == total}
  return have == set(range(total))


def scan(directory, basename):
  """Complete `<basename>-<step>` checkpoints in directory, by step (oldest first)."""
  pattern = os.path.join(directory, basename + "-*.index")
  for _ in range(_LOOKS):
    prefixes, vanished = [], False
    for index in tf.io.gfile.glob(pattern):
      prefix = index[:-len(".index")]
      if files.step_from_prefix(prefix) is None:
        continue
      if is_complete(prefix):
        prefixes.append(prefix)
      elif not tf.io.gfile.exists(index):
        # Pruned since the glob; a trainer saves the next one before it prunes, and
        # that one may have been too new for the glob: look again.
        vanished = True
    if not vanished:
      break
  return sorted(prefixes, key=files.step_from_prefix)


def _name(prefix):
  return os.path.basename(prefix)


def find_checkpoints(directory, basename="model.ckpt"):
  """The directory's complete checkpoints by the rule above; returns a Found.

  A trainer saving meanwhile can make a look need a note that a moment later it would
  not, so such a look is repeated a few times; the first without a note (or else the
  last) is returned.
  """
  directory = os.fspath(directory)
  for look in range(_LOOKS):
    if look:
      time.sleep(_LOOK_PAUSE_SECS)
    found = _find_once(directory, basename)
    if found.note is None:
      break
  return found


def _find_once(directory, basename):
  state_path = os.path.join(directory, files.STATE_FILENAME)
  listed, problem = files.read_state_file(directory)
  scanned = scan(directory, basename)
  if problem is not None:
    if problem == "missing" and not scanned:
      return Found([], None, True)  # a new directory
    note = "state file %s is %s" % (state_path, problem)
    if scanned:
      note += ("; using %s, the newest of %d complete checkpoint(s) found by scanning "
               "%s-*.index" % (_name(scanned[-1]), len(scanned), basename))
    else:
      note += "; no complete %s-* checkpoint found by scanning" % basename
    return Found(scanned, note, False)
  complete = [p for p in listed if is_complete(p)]
  notes = []
  if listed and listed[-1] not in complete:
    notes.append("the latest checkpoint the state file names, %s, is incomplete (its "
                 ".index or data file is missing)" % _name(listed[-1]))
  newest_step = max([files.step_from_prefix(p) or -1 for p in complete] + [-1])
  newer = [p for p in scanned
           if p not in complete and files.step_from_prefix(p) > newest_step]
  if newer:
    notes.append("found newer complete checkpoint(s) the state file does not list: %s"
                 % ", ".join(_name(p) for p in newer))
  checkpoints = complete + newer
  if notes:
    using = _name(checkpoints[-1]) if checkpoints else "none"
    return Found(checkpoints, "; ".join(notes) + "; using %s" % using, False)
  return Found(checkpoints, None, len(complete) == len(listed))


def leftovers(directory, basename="model.ckpt"):
  """Files a killed save or prune left behind: the hidden temporaries this library
  writes through (checkpoints, the state file, text files), and data shards of
  `<basename>-<step>` prefixes that have no .index (and that the state file does not
  name). Returns their paths, sorted."""
  listed, _ = files.read_state_file(directory)
  listed = set(listed)
  found = []
  for name in tf.io.gfile.listdir(directory):
    path = os.path.join(directory, name)
    if _TEMPORARY.match(name):
      found.append(path)
    elif name.startswith(basename + "-") and _DATA.search(name):
      prefix = _DATA.sub("", path)
      if (files.step_from_prefix(prefix) is not None and prefix not in listed
          and not tf.io.gfile.exists(files.index_file(prefix))):
        found.append(path)
  return sorted(found)


class Latest(str):
  """A checkpoint prefix picked as the newest of `directory`: readers read it while it
  is there, else (pruned) the directory's newest complete checkpoint; a plain prefix
  string that vanishes is an error instead."""

  def __new__(cls, prefix, directory):
    latest = super().__new__(cls, prefix)
    latest.directory = os.fspath(directory)
    return latest


def latest(directory, basename="model.ckpt", report=print):
  """The newest complete checkpoint of directory as a Latest, or None if it has none;
  find_checkpoints' note (if any) goes to report."""
  found = find_checkpoints(directory, basename)
  if found.note and report is not None:
    report(found.note)
  return Latest(found.checkpoints[-1], directory) if found.checkpoints else None


def latest_of(path):
  """The directory whose newest checkpoint path stands for (path a directory or a
  Latest), else None (path names one checkpoint)."""
  if isinstance(path, Latest):
    return path.directory
  path = os.fspath(path)
  return path if tf.io.gfile.isdir(path) else None


def resolve_prefix(path, report=print):
  """The checkpoint prefix that path names.

  path may be a prefix, its `.index` or a data file, or a directory: then its latest
  complete checkpoint by find_checkpoints, whose note (if any) goes to report; or a
  Latest: itself while complete, else its directory's latest. Raises CheckpointError
  naming the file when there is none.
  """
  if isinstance(path, Latest):
    if is_complete(path):
      return str(path)
    newer = resolve_prefix(path.directory, report=None)
    if report is not None:
      report("checkpoint %s was deleted (pruned by a trainer?); using %s, now the newest "
             "complete checkpoint of %s" % (_name(path), _name(newer), path.directory))
    return newer
  path = os.fspath(path)
  if path.endswith(".index"):
    path = path[:-len(".index")]
  path = _DATA.sub("", path)
  if tf.io.gfile.isdir(path):
    found = find_checkpoints(path)
    if not found.checkpoints:
      state = os.path.join(path, files.STATE_FILENAME)
      raise CheckpointError(
          "no checkpoint in directory %s: %s" % (path, found.note or (
              "its state file %s is missing and no complete model.ckpt-<step> was found "
              "by scanning" % state)), file=state)
    if found.note and report is not None:
      report(found.note)
    return found.checkpoints[-1]
  if not files.exists(path):
    raise CheckpointError("checkpoint %s not found: %s does not exist"
                          % (path, files.index_file(path)), file=files.index_file(path))
  return path
