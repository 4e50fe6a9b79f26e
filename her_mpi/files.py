"""Atomic file writes: a killed job never leaves a half-written file.

Every write goes to a temporary file in the same directory, is fsynced, then renamed over the old
one; a failed write (disk full, read-only directory) raises :class:`CheckpointWriteError` naming
the path while the previous file stays. Imports nothing heavy, so launchers and tools that only
read or write small records can use it without torch.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


class CheckpointWriteError(OSError):
    """A file could not be written (disk full, read-only directory...); whatever was at its path
    before is unchanged, since the write went to a temporary file."""

    def __init__(self, path: Path, cause: BaseException):
        self.path = Path(path)
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
        super().__init__(f"could not write {str(self.path)!r}: {reason} (nothing there was replaced; "
                         f"free disk space or fix the directory's permissions)")


def atomic_write(path: Path, write: Callable[[object], None], mode: str = "wb") -> int:
    """Write ``path`` through ``write(file)`` atomically; returns the bytes written."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make outputs unreadable to others
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
        return size
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise CheckpointWriteError(path, exc) from exc
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def sync_directory(directory: Path) -> None:
    """Make the renames in ``directory`` durable (best effort: not every filesystem allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(directory: Path) -> None:
    """Delete temporary files left by a job killed in the middle of a write."""
    for tmp in Path(directory).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
