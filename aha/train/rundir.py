"""The run directory: what a run writes there, what it may delete, which inputs must stay out of its way, and the
lock that keeps a second run out while one is using it."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from .._version import __version__
from ..fileio import DiskFullError, atomic_write, fsync_dir, remove_directory

log = logging.getLogger("aha.train")
WRITE_PROBE = ".aha-write-probe"
"""Written and removed at set-up to prove output_dir is writable before any model is loaded (one per process)."""
RUN_FILES = ("config.yaml", "metrics.jsonl", "completions.jsonl", "groups.jsonl", "held_out.jsonl", "tensorboard",
             "model")
"""What a run writes into output_dir (besides checkpoint-N): their presence means an earlier run is there."""
CHECKPOINT_NAME = re.compile(r"^\.?checkpoint-\d+(\.tmp|\.old)?$")
RUN_MARKER = ".aha-run.json"
"""Written by a run that starts in a directory holding no run files, so the run files beside it are provably
aha's: overwrite_output_dir deletes them only where it is."""
LOCK_FILE = ".aha-lock"
"""flock()ed for the whole of train(); it names the holder. The kernel drops the lock when its process dies, so a
file left by a killed run is no lock at all."""
LOCK_TRIES = 3
"""Attempts to lock a lock file that its holder deletes as we open it."""
NEW_FILES = ".aha-new-files"
"""The hidden folder inside a target folder where `files_beside` has its files written before moving them in."""
MODEL_FILES = ("model*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model*.bin.index.json",
               "adapter_*")
"""The weight and adapter files of a saved model: one save's files of another layout (an adapter, a single file, shards)
beside another's make transformers or PEFT load the wrong weights."""
HELD = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
"""flock(LOCK_NB) failures that mean another open file holds the lock."""
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
"""flock() failures of a filesystem without locks (some network mounts): the run goes on, unguarded, with a warning."""


class OutputDirInUseError(RuntimeError):
    """Another live process is training into this output_dir; the message names it."""


def check_writable(run_dir: Path) -> None:
    """Create `run_dir` and write a probe file there, so an unwritable or full disk fails now."""
    probe = run_dir / f"{WRITE_PROBE}-{os.getpid()}"  # two runs starting at once must not remove each other's
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise DiskFullError(probe) from e
        raise PermissionError(f"output_dir {run_dir} is not writable: {e.strerror or e}") from e


def run_files(run_dir: Path) -> list[Path]:
    """The entries of `run_dir` a run writes (RUN_FILES, checkpoints and their temporary siblings)."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.iterdir() if p.name in RUN_FILES or CHECKPOINT_NAME.match(p.name))


def _listed(paths: list[Path]) -> str:
    return ", ".join(p.name for p in paths[:4]) + (", ..." if len(paths) > 4 else "")


def check_fresh(run_dir: Path, overwrite: bool) -> None:
    """Refuse an output_dir that holds an earlier run, whose logs a new run would otherwise append to; with
    `overwrite`, remove that run's files first, but only where RUN_MARKER proves a run wrote them (nothing else in
    the directory is touched)."""
    old = run_files(run_dir)
    if old and not (run_dir / RUN_MARKER).is_file():
        raise FileExistsError(f"output_dir {run_dir} holds {_listed(old)}, which no aha run is known to have written "
                              f"(no {RUN_MARKER}): aha neither deletes nor adds to them. Choose another output_dir, "
                              "move or delete them yourself, or set resume=true if they are an earlier run to continue")
    if old and not overwrite:
        raise FileExistsError(f"output_dir {run_dir} holds an earlier run ({_listed(old)}): set resume=true to "
                              "continue it, overwrite_output_dir=true to replace it, or choose another output_dir")
    for p in old:
        if p.is_dir():
            remove_directory(p)
        else:
            p.unlink()


def mark_run(run_dir: Path) -> None:
    """Say that the run files in `run_dir` are a run's (after check_fresh found none, or removed them)."""
    atomic_write(run_dir / RUN_MARKER, json.dumps({"written_by": f"aha {__version__}", "run_files": list(RUN_FILES),
                                                   "checkpoints": "checkpoint-N"}) + "\n")


def check_inputs(run_dir: Path, inputs: Iterable[tuple[str, object]]) -> None:
    """Refuse an input (model, dataset, reward module: `(what, path)`) that lies where this run writes or deletes:
    save_model replaces output_dir/model, overwrite_output_dir clears the run files, save_total_limit removes
    checkpoints. An input elsewhere in output_dir is left alone, so it may stay there."""
    root = run_dir.resolve()
    for what, path in inputs:
        if not isinstance(path, (str, os.PathLike)) or not str(path) or not Path(path).exists():
            continue  # a hub id, a model object, nothing
        resolved = Path(path).resolve()
        if root not in resolved.parents:
            continue
        top = resolved.relative_to(root).parts[0]
        if top in RUN_FILES or CHECKPOINT_NAME.match(top):
            raise ValueError(f"{what} {path} lies inside output_dir {run_dir}, in {top}, which the run writes or "
                             "deletes: copy it elsewhere or choose another output_dir")


def _holder(fd: int) -> str:
    """The lock holder's note ("pid 12 on host h since ...: aha train ..."), or "another process"."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on {info['host']} since {info['since']}: {info['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _lock(path: Path) -> int | None:
    """An fd holding flock(LOCK_EX) on `path`, or None where the filesystem has no locks; raises
    OutputDirInUseError while another process holds it."""
    for _ in range(LOCK_TRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _holder(fd)
            os.close(fd)
            if e.errno in NO_FLOCK:
                log.warning("cannot lock %s (%s): a second run into %s would not be refused", path, e, path.parent)
                return None
            if e.errno not in HELD:
                raise
            raise OutputDirInUseError(
                f"output_dir {path.parent} is in use by another aha run ({holder}); wait for it to end or choose "
                f"another output_dir (the lock on {path} ends with that process)") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            note = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "command": " ".join(sys.argv)}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(note).encode(), 0)
            return fd
        os.close(fd)  # its holder removed the file as we opened it: lock the new one
    raise OutputDirInUseError(f"output_dir {path.parent}: could not lock {path} (other runs keep replacing it)")


@contextmanager
def lock_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold output_dir's lock for the body (one run at a time per directory); the file goes with the lock."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = _lock(path)
    try:
        yield
    finally:
        if fd is not None:
            try:
                path.unlink(missing_ok=True)  # still locked: a run that opened the old file retries the new one
            finally:
                os.close(fd)  # releases the lock


@contextmanager
def files_beside(target: Path, replaces: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a path inside `target` for the body to write a folder at; then remove the files of `target` that match a
    pattern of `replaces` and that the body did not write, move each of its entries into `target`, one rename each
    (an entry of the same name is replaced), and remove the emptied folder. Nothing else in `target` changes; a
    failed body leaves `target` as it was."""
    new = target / NEW_FILES
    shutil.rmtree(new, ignore_errors=True)  # left by a killed save
    try:
        yield new
        written = {entry.name for entry in new.iterdir()}
        for old in target.iterdir():
            if old.is_file() and old.name not in written and any(old.match(p) for p in replaces):
                old.unlink()
        for entry in sorted(new.iterdir()):
            os.replace(entry, target / entry.name)
        fsync_dir(target)
    finally:
        shutil.rmtree(new, ignore_errors=True)
