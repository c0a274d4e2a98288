"""`DirectoryLock`: one writer per checkpoint directory.

An exclusive `flock` on `<directory>/.mesh_tf.lock`. The operating system drops it when
the holding process exits, however it exits, so a killed run never leaves a stale lock.
The file keeps the holder's pid, host and start time, so a refused run can say who holds
the directory. The file itself stays (removing a locked file would let a third process
lock a new file of the same name while the first still writes).
"""
import datetime
import fcntl
import os
import socket

from mesh_tf.errors import CheckpointError

LOCK_FILENAME = ".mesh_tf.lock"


class DirectoryLock:
  """Holds the exclusive lock of a directory from acquire() until release() or exit.

  Raises CheckpointError from acquire() when another process holds it (naming the
  directory and that process) or when the directory cannot be written.
  """

  def __init__(self, directory):
    self.directory = os.fspath(directory)
    self.path = os.path.join(self.directory, LOCK_FILENAME)
    self._fd = None

  def acquire(self):
    """Takes the lock; returns self."""
    try:
      os.makedirs(self.directory, exist_ok=True)
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise CheckpointError("cannot write to model_dir %s: %s" % (self.directory,
                                                                  e.strerror or e),
                            file=self.directory) from e
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = os.read(fd, 512).decode("utf-8", "replace").strip() or "unknown process"
      os.close(fd)
      raise CheckpointError(
          "model_dir %s is in use by another trainer (%s); only one run may write a "
          "model_dir at a time: wait for it to finish, stop it, or use another "
          "--model_dir" % (self.directory, holder), file=self.path) from None
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    os.ftruncate(fd, 0)
    os.pwrite(fd, ("pid %d on host %s, started %s\n"
                   % (os.getpid(), socket.gethostname(), started)).encode(), 0)
    self._fd = fd
    return self

  def release(self):
    """Drops the lock (also dropped when the process exits)."""
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *unused):
    self.release()
