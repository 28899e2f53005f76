"""`aha dashboard`: a local web app over run directories (server.py) and its vendored static files."""

from __future__ import annotations


def build_app(cfg):
    """The Starlette app for a DashboardConfig."""
    from .server import build
    return build(cfg.runs, cfg.runs_root, cfg.playground_dir, cfg.playground_model, cfg.playground_max_steps,
                 cfg.playground_time_s, cfg.host)


def serve_in_background(run_dir: str, port: int, host: str = "127.0.0.1") -> str:
    """Serve one run directory from a daemon thread (`aha train ... dashboard=true`); returns the URL."""
    from .server import Server, build
    from pathlib import Path
    app = build([run_dir], str(Path(run_dir).parent), None, None, 30, 300.0, host)
    return Server(app, host, port).start()
