"""Metric sinks behind one interface: `log(step, flat_dict)` and `close()`.

Metrics are one flat dict with slash names (`reward/mean`, `clip/high`, `perf/tokens_per_s`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path


class Logger:
    """No-op sink; subclasses write somewhere."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlLogger(Logger):
    """One JSON object per line: {"step": s, ...metrics}. Appends, so a resumed run continues it."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a")

    def log(self, step, metrics):
        clean = {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None)
                 for k, v in metrics.items()}
        self.f.write(json.dumps({"step": step, **clean}) + "\n")
        self.f.flush()

    def close(self):
        self.f.close()


class TensorBoardLogger(Logger):
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter
        self.w = SummaryWriter(str(log_dir))

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

    def close(self):
        for lg in self.loggers:
            lg.close()


SINKS = {"jsonl": lambda d: JsonlLogger(d / "metrics.jsonl"),
         "tensorboard": lambda d: TensorBoardLogger(d / "tensorboard")}


def make_logger(report_to: list[str], run_dir: Path) -> Logger:
    unknown = [r for r in report_to if r not in SINKS and r != "none"]
    if unknown:
        raise ValueError(f"unknown report_to {unknown}; valid: {sorted(SINKS)} or none")
    return MultiLogger([SINKS[r](Path(run_dir)) for r in report_to if r in SINKS])


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics.jsonl; a resumed run's repeated steps keep the latest row."""
    rows: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]


def plot_metrics(metrics_path: Path, keys: list[str], out: Path, title: str = "") -> Path:
    """One PNG with a panel per metric key over steps (keys with no values are skipped)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = read_metrics(metrics_path)
    keys = [k for k in keys if any(r.get(k) is not None for r in rows)]
    fig, axes = plt.subplots(1, max(len(keys), 1), figsize=(4.2 * max(len(keys), 1), 3.2), squeeze=False)
    for ax, k in zip(axes[0], keys):
        pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if len(pts) < 30 else None, ms=3)
        ax.set_title(k)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
