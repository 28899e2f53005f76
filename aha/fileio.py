"""Crash-safe files and directories: written beside their target and renamed into place, fsynced, so a
reader (or a resume after kill -9) sees the old version or the new one, never a half-written one."""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TMP_SUFFIX, ASIDE_SUFFIX = ".tmp", ".old"
"""Hidden siblings `.NAME.tmp` (being written) and `.NAME.old` (being replaced or deleted)."""


NEARLY_FULL_BYTES = 1 << 20
"""A write that fails while its filesystem has less than this free is reported as a full disk, whatever the
writer raised: torch.save raises RuntimeError ("unexpected pos ..."), safetensors SafetensorError, not ENOSPC."""
ENOSPC_TEXTS = (os.strerror(errno.ENOSPC), f"os error {errno.ENOSPC}")
"""How writers that wrap the error say ENOSPC (safetensors: "I/O error: No space left on device (os error 28)");
safetensors also deletes its partial file before raising, so free space alone may no longer show it."""


class DiskFullError(OSError):
    """ENOSPC while writing a run artefact; names what was being written (and, when the disk was found full
    after another error, the bytes left free)."""

    def __init__(self, path: str | Path, free: int | None = None):
        left = "" if free is None else f" ({free} bytes free)"
        super().__init__(errno.ENOSPC, f"no space left on device while writing {path}{left}")
        self.path, self.free = Path(path), free

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self):  # OSError pickles its (errno, strerror) args, which __init__ does not take
        return type(self), (self.path, self.free)


def free_bytes(path: str | Path) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`; None if it cannot be read."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _disk_full(error: BaseException, target: Path, where: Path) -> DiskFullError | None:
    """The DiskFullError that writing `target` (into directory `where`) failed with, or None: the error is not
    a full disk and goes up as it is. ENOSPC is one; so is any other failure of the write while the filesystem
    is (nearly) full (checked before the partial output is removed, which frees its space), or whose message
    says ENOSPC."""
    if isinstance(error, DiskFullError):
        return None
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return DiskFullError(target)
    if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit, a simulated kill: no failed write
        return None
    free = free_bytes(where)
    if free is not None and free < NEARLY_FULL_BYTES:
        return DiskFullError(target, free)
    return DiskFullError(target) if any(t in str(error) for t in ENOSPC_TEXTS) else None


def fsync_dir(path: str | Path) -> None:
    """Make renames and new entries in `path` durable (a file's fsync does not cover its name)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Flush every file under `path`, then the directories that name them."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(root)


def _sibling(path: Path, suffix: str) -> Path:
    return path.parent / f".{path.name}{suffix}"


def remove_directory(path: Path) -> None:
    """Rename aside, then delete: a crash mid-delete leaves only a hidden directory behind."""
    aside = _sibling(path, ASIDE_SUFFIX)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(path, aside)
    fsync_dir(path.parent)
    shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def atomic_directory(final: str | Path) -> Iterator[Path]:
    """Yield a hidden temporary directory next to `final`; on success make it `final` atomically.

    Every file is fsynced before the rename. An existing `final` is renamed aside, the new one
    renamed in, then the old deleted, so at every instant `final` is either absent, the old
    directory or the new one. On any error the temporary directory is removed; running out of
    space (ENOSPC, or any error while the filesystem is nearly full) raises DiskFullError naming
    `final`, chained to the writer's error.
    """
    final = Path(final)
    tmp = _sibling(final, TMP_SUFFIX)
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)  # left by an earlier crash
    try:
        tmp.mkdir()
        yield tmp
        fsync_tree(tmp)
    except BaseException as e:
        full = _disk_full(e, final, final.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from e
        raise
    if final.exists():
        aside = _sibling(final, ASIDE_SUFFIX)
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, final)
        fsync_dir(final.parent)


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to a hidden sibling, fsync it, rename it over `path`; a full disk -> DiskFullError."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        full = _disk_full(e, path, path.parent)
        tmp.unlink(missing_ok=True)
        if full is not None:
            raise full from e
        raise
    fsync_dir(path.parent)
    return path
