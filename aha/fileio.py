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


class DiskFullError(OSError):
    """ENOSPC while writing a run artefact; names what was being written."""

    def __init__(self, path: str | Path):
        super().__init__(errno.ENOSPC, f"no space left on device while writing {path}")

    def __str__(self) -> str:
        return self.strerror


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
    space raises DiskFullError naming `final`.
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
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC and not isinstance(e, DiskFullError):
            raise DiskFullError(final) from e
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
    """Write `data` to a hidden sibling, fsync it, rename it over `path`; ENOSPC -> DiskFullError."""
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
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise DiskFullError(path) from e
        raise
    fsync_dir(path.parent)
    return path
