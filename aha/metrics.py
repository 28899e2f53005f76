"""Metric sinks behind one interface: `log(step, flat_dict)` and `close()`.

Metrics are one flat dict with slash names (`reward/mean`, `clip/high`, `perf/tokens_per_s`).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
from pathlib import Path

from .fileio import DiskFullError, atomic_write

log = logging.getLogger("aha.metrics")
_TAIL_CHUNK = 1 << 16
"""Bytes read at a time when looking back for the last newline of a JSONL file."""
_FILE_MODE = 0o644
"""Permissions of a new log file (before the umask), as open() would give it."""


class Logger:
    """No-op sink; subclasses write somewhere."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_table(self, step: int, name: str, rows: list[dict]) -> None:
        """A table of rows with the same keys (GRPO's completion groups); sinks without tables ignore it."""

    def close(self) -> None:
        pass


def _finite(metrics: dict) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def _cells(rows: list[dict]) -> tuple[list[str], list[list]]:
    """Columns and rows for a tracker table: nested values (per-function rewards, chat prompts) as JSON text."""
    columns = list(rows[0])
    return columns, [[v if isinstance(v, (str, int, float, type(None))) else json.dumps(v) for v in r.values()]
                     for r in rows]


class WandbLogger(Logger):
    """Weights & Biases (optional `wandb`): metrics and completion tables; WANDB_MODE=offline writes only
    to output_dir/wandb. The project is $WANDB_PROJECT (default "aha"), the run is run_name or output_dir's name."""

    def __init__(self, run_dir: Path, config: dict | None, resume_step: int | None = None):
        import wandb
        self.wandb = wandb
        name = (config or {}).get("run_name") or run_dir.name
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "aha"), dir=str(run_dir), name=name,
                              config=config or {}, resume="allow" if resume_step is not None else None)

    def log(self, step, metrics):
        self.run.log(_finite(metrics), step=step)

    def log_table(self, step, name, rows):
        columns, data = _cells(rows)
        self.run.log({name: self.wandb.Table(columns=columns, data=data)}, step=step)

    def close(self):
        self.run.finish()


class TrackioLogger(Logger):
    """Trackio (optional `trackio`, local-first: a SQLite file under $TRACKIO_DIR): metrics and completion tables.
    The project is $TRACKIO_PROJECT (default "aha"), the run is run_name or output_dir's name."""

    def __init__(self, run_dir: Path, config: dict | None, resume_step: int | None = None):
        import trackio
        self.trackio = trackio
        trackio.init(project=os.environ.get("TRACKIO_PROJECT", "aha"), name=(config or {}).get("run_name") or run_dir.name,
                     config=config or {},
                     resume="allow" if resume_step is not None else "never")

    def log(self, step, metrics):
        self.trackio.log(_finite(metrics), step=step)

    def log_table(self, step, name, rows):
        columns, data = _cells(rows)
        self.trackio.log({name: self.trackio.Table(columns=columns, data=data)}, step=step)

    def close(self):
        self.trackio.finish()


# ---------------------------------------------------------------- line-atomic JSONL
def cut_torn_tail(path: Path) -> None:
    """Drop a last line with no newline (a write cut short by a crash or a full disk)."""
    if not path.is_file():
        return
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            start = max(pos - _TAIL_CHUNK, 0)
            f.seek(start)
            chunk = f.read(pos - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                pos = start + newline + 1
                break
            pos = start
        if pos < end:
            log.warning("%s: cut a torn last line (%d bytes) before appending", path, end - pos)
            f.truncate(pos)


def open_jsonl(path: Path) -> int:
    """A descriptor for appending whole lines (O_APPEND), after cutting any torn last line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cut_torn_tail(path)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, _FILE_MODE)


def write_lines(fd: int, path: Path, rows: list[dict]) -> None:
    """Append rows as JSON lines in one write; a short write is undone so no line is ever torn."""
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    size = os.fstat(fd).st_size
    try:
        if os.write(fd, data) == len(data):
            return
        error = OSError(errno.ENOSPC, "short write")  # the disk filled part-way through
    except OSError as e:
        error = e
    os.ftruncate(fd, size)
    if error.errno == errno.ENOSPC:
        raise DiskFullError(path) from error
    raise error


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Open, append `rows` as whole lines, close."""
    fd = open_jsonl(path)
    try:
        write_lines(fd, path, rows)
    finally:
        os.close(fd)


def keep_steps_through(path: Path, step: int) -> None:
    """Rewrite a JSONL log keeping rows with step <= `step` (a resumed run writes the rest again).

    Written to a temporary file and renamed over the log, so a crash leaves one or the other.
    """
    if not path.is_file():
        return
    lines = path.read_bytes().split(b"\n")
    kept = []
    for line in lines[:-1]:  # the piece after the last newline is empty or a torn line
        try:
            row = json.loads(line)
        except ValueError:
            kept.append(line)  # not ours to judge; read_metrics reports it
            continue
        if not isinstance(row, dict) or not isinstance(row.get("step"), int) or row["step"] <= step:
            kept.append(line)
    atomic_write(path, b"".join(line + b"\n" for line in kept))


class JsonlLogger(Logger):
    """One JSON object per line: {"step": s, ...metrics}. Appends, so a resumed run continues it."""

    def __init__(self, path: Path, resume_step: int | None = None):
        if resume_step is not None:
            keep_steps_through(path, resume_step)
        self.path = path
        self.fd = open_jsonl(path)

    def log(self, step, metrics):
        clean = {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None)
                 for k, v in metrics.items()}
        write_lines(self.fd, self.path, [{"step": step, **clean}])

    def close(self):
        os.close(self.fd)


class TensorBoardLogger(Logger):
    def __init__(self, log_dir: Path, resume_step: int | None = None):
        """On resume, events after `resume_step` (the crashed run's) are purged from the curves."""
        from torch.utils.tensorboard import SummaryWriter
        self.w = SummaryWriter(str(log_dir), purge_step=None if resume_step is None else resume_step + 1)

    def log(self, step, metrics):
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.w.add_scalar(k, v, step)
        self.w.flush()

    def close(self):
        self.w.close()


class MultiLogger(Logger):
    def __init__(self, loggers: list[Logger]):
        self.loggers = loggers

    def log(self, step, metrics):
        for lg in self.loggers:
            lg.log(step, metrics)

    def log_table(self, step, name, rows):
        for lg in self.loggers:
            lg.log_table(step, name, rows)

    def close(self):
        for lg in self.loggers:
            lg.close()


SINKS = {"jsonl": lambda d, config, resume_step: JsonlLogger(d / "metrics.jsonl", resume_step),
         "tensorboard": lambda d, config, resume_step: TensorBoardLogger(
             Path((config or {}).get("logging_dir") or d / "tensorboard"), resume_step),
         "wandb": WandbLogger, "trackio": TrackioLogger}


def make_logger(report_to: list[str], run_dir: Path, resume_step: int | None = None,
                config: dict | None = None) -> Logger:
    """metrics.jsonl, always (the run's own record), and the sinks of `report_to` in `run_dir`; with `resume_step`,
    what was logged after that step is dropped first. `config` (the effective run config) goes to the trackers that
    record one."""
    unknown = [r for r in report_to if r not in SINKS and r != "none"]
    if unknown:
        raise ValueError(f"unknown report_to {unknown}; valid: {sorted(SINKS)} or none")
    names = ["jsonl"] + [r for r in dict.fromkeys(report_to) if r in SINKS and r != "jsonl"]
    return MultiLogger([SINKS[r](Path(run_dir), config, resume_step) for r in names])


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics.jsonl; a resumed run's repeated steps keep the latest row.

    A torn last line (no newline: the writer died mid-line) is skipped with a warning.
    """
    text = Path(path).read_text()
    lines = text.split("\n")
    rows: dict[int, dict] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if i == len(lines) - 1:
                log.warning("%s: skipped a torn last line (%d characters)", path, len(line))
                continue
            raise
        rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]


PLOT_COLUMNS = 4
"""Panels per row of a metrics plot."""


def plot_metrics(metrics_path: Path, keys: list[str] | None, out: Path, title: str = "") -> Path:
    """One PNG, a grid of panels, one per metric over steps (None: every metric with a value; a metric
    with no value is skipped), each with its name on the y axis and "step" on the x axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = read_metrics(metrics_path)
    if keys is None:
        keys = sorted({k for r in rows for k, v in r.items() if k != "step" and isinstance(v, (int, float))})
    keys = [k for k in keys if any(r.get(k) is not None for r in rows)]
    ncols = min(PLOT_COLUMNS, max(len(keys), 1))
    nrows = max(1, -(-len(keys) // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.axis("off")
    for ax, k in zip(axes.flat, keys):
        pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if len(pts) < 30 else None, ms=3)
        ax.set_xlabel("step")
        ax.set_ylabel(k, fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
