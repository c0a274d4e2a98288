"""Checkpoints: every variable at full shape under its mtf name, in TF's bundle format.

`save_checkpoint` / `restore_checkpoint` write and read one checkpoint;
`CheckpointManager` keeps numbered checkpoints in a directory. A checkpoint saved on
one mesh and layout restores on any other, and checkpoints of the original library
(name-based, TF1 `Saver`) restore by name.
"""
from mesh_tf.checkpoint.entries import Entry, collect_entries
from mesh_tf.checkpoint.files import STATE_FILENAME, step_from_prefix
from mesh_tf.checkpoint.manager import CheckpointManager
from mesh_tf.checkpoint.record import RECORD_KEY, read_record
from mesh_tf.checkpoint.save_restore import (RestoreResult, restore_checkpoint,
                                             save_checkpoint, write_checkpoint)
