"""Reading what a side wrote, on the orchestrator's side, without being steered by it.

A side can leave anything in its worktree and output directory: symbolic links (to the other side's
outputs, to the repository's refs, to ``/dev/zero``), FIFOs, huge files. The orchestrator reads such
files only through these helpers: every path component below a trusted root is opened with
``O_NOFOLLOW`` (no link anywhere, not only at the end), the file must be a regular file, and reads are
capped. Errors are ``UnsafeFile`` (a ValueError) naming what was wrong.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DEFAULT_LIMIT = 64 * 1024 * 1024


class UnsafeFile(ValueError):
    pass


def _open_beneath(root: Path, path: Path, final_flags: int) -> int:
    rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
    parts = [p for p in rel.parts if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnsafeFile(f"{path}: '..' in a path below {root}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = (final_flags if last else os.O_RDONLY | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (40, 20):  # ELOOP / ENOTDIR: a link where a file or directory was expected
                    raise UnsafeFile(f"{rel}: {part!r} is a symbolic link") from None
                raise UnsafeFile(f"{rel}: {part!r}: {exc.strerror}") from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_beneath(root: Path, path: Path, limit: int = DEFAULT_LIMIT) -> bytes:
    """The bytes of ``path`` (below ``root``): no links on the way, a regular file, at most ``limit`` bytes."""
    fd = _open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path.name}: not a regular file")
        if st.st_size > limit:
            raise UnsafeFile(f"{path.name}: {st.st_size} bytes, more than the {limit} allowed")
        chunks, left = [], limit + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > limit:
            raise UnsafeFile(f"{path.name}: more than the {limit} bytes allowed")
        return data
    finally:
        os.close(fd)


def list_beneath(root: Path, path: Path) -> list[str]:
    """Names in the directory ``path`` (below ``root``), reached without following links."""
    fd = _open_beneath(root, path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def exists_beneath(root: Path, path: Path) -> bool:
    try:
        os.close(_open_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK))
        return True
    except (UnsafeFile, OSError):
        return False


def write_beneath(root: Path, path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` below ``root``, creating missing directories, never through a link:
    a symbolic link anywhere on the way (a side may have swapped a directory for one) refuses."""
    rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
    parts = [p for p in rel.parts if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise UnsafeFile(f"{path}: not a path below {root}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise UnsafeFile(f"{rel}: {part!r} is not a directory ({exc.strerror})") from None
            os.close(fd)
            fd = nxt
        try:
            os.unlink(parts[-1], dir_fd=fd)  # whatever is there (a link, a FIFO) is replaced, not followed
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise UnsafeFile(f"{rel}: is a directory") from None
        out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        try:
            os.write(out, data)
            os.fchmod(out, mode)
        finally:
            os.close(out)
    finally:
        os.close(fd)
