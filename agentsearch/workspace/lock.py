"""An exclusive, process-lifetime lock on a workspace (fcntl), naming its holder."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..errors import LockedError


class WorkspaceLock:
    """``with WorkspaceLock(path):`` — a second holder gets "locked by pid N"."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> WorkspaceLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 64).decode().strip() or "unknown"
            finally:
                os.close(fd)
            raise LockedError(
                f"workspace {self.path.parent} is locked by pid {holder}; wait for it to finish or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WorkspaceLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
