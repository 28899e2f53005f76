"""The dashboard's web server (Starlette, served by uvicorn): a JSON API over run directories and the
Learn GRPO explainer, plus the static page.

Safety: it binds 127.0.0.1 unless told otherwise; it answers only to a local or configured Host and takes
state-changing requests only as JSON from its own page (guard.py: no cross-site POST, no DNS rebinding); runs
are addressed by id and files only inside a known run's directory, never through a link out of it, and only of
the types the Runs page links, inert (a download, or an image under a sandbox); the only job a request can
start is the bounded playground; a file that cannot be read is an error in the answer, never a crash of the
server, and a bad line of a run file is reported by its number while the rest is served. Every answer is strict
JSON: NaN and Infinity (which Python writes and browsers refuse) are served as null, a gap.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from . import explain, supervision, toy
from .guard import FILE_CSP, Guard, Inert
from .playground import Playground
from .text import prompt_text
from ..behaviour import DEFAULT_REFLECTION_PHRASES
from .runs import (GROUPS, HELD_OUT, METRICS, SERVED_FILES, SHOWN_INLINE, GroupIndex, MetricsCache, RunRegistry,
                   aha_moments, columns, config_diff, held_out_table, read_config, reflection_by_step, safe_file,
                   summary)

log = logging.getLogger("aha.dashboard")
STATIC = Path(__file__).parent / "static"
LOCALHOST = "127.0.0.1"
LEARN = {"advantages": explain.advantages, "ratio": explain.ratio, "kl": explain.kl,
         "aggregation": explain.aggregation, "supervision": supervision.outcome_vs_process, "toy": toy.update}
"""The Learn GRPO explainers: POST /api/learn/<name> with the page's inputs, answered by aha.algos."""
MAX_DIFF_RUNS = 8
"""Most runs whose configs are compared at once."""


class StrictJSON(JSONResponse):
    """A JSON answer a browser can parse: a NaN or an Infinity (from a run file, a config) is served as null, a gap.
    Only an answer holding one is encoded twice."""

    def render(self, content) -> bytes:
        try:
            return super().render(content)  # strict: refuses NaN and Infinity
        except ValueError:  # json writes them as bare words, which JSON.parse refuses: read back as null
            return super().render(json.loads(json.dumps(content), parse_constant=lambda word: None))


def _error(status: int, message: str) -> JSONResponse:
    return StrictJSON({"error": message}, status_code=status)


def _run(request: Request, registry: RunRegistry) -> tuple[str, Path] | JSONResponse:
    run_id = request.query_params.get("run", "")
    path = registry.get(run_id)
    return (run_id, path) if path is not None else _error(404, f"no run {run_id!r}")


def _int(request: Request, key: str, default: int) -> int:
    try:
        return max(0, int(request.query_params.get(key, default)))
    except ValueError:
        return default


def _post(fn):
    """A POST handler: the JSON body to `fn`, its dict back; explain.BadInput is a 400 with its message."""
    async def handler(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body must be JSON")
        try:
            return StrictJSON(fn(body if isinstance(body, dict) else {}))
        except explain.BadInput as e:
            return _error(400, str(e))
    return handler


async def _crash(request: Request, exc: Exception):
    log.exception("dashboard: %s failed", request.url.path)
    return _error(500, f"{type(exc).__name__}: {exc}")


class Api:
    """The GET handlers over the runs of `registry`."""

    def __init__(self, registry: RunRegistry, playground: Playground):
        self.registry, self.playground = registry, playground
        self.index, self.cache = GroupIndex(), MetricsCache()

    async def runs(self, request: Request):
        """Every run with its summary; `root` and `given` say where runs were looked for, `empty` which given folders
        hold none (yet), so that the page can say why it shows nothing."""
        reg = self.registry
        return StrictJSON({"runs": [summary(i, p, self.cache.read) for i, p in reg.runs().items()],
                           "root": str(reg.root), "given": [str(d) for d in reg.fixed], "empty": reg.empty()})

    async def config_diff(self, request: Request):
        """?runs=A,B: the config keys on which the runs differ, each run's value."""
        ids = [i for i in request.query_params.get("runs", "").split(",") if i][:MAX_DIFF_RUNS]
        found = {i: self.registry.get(i) for i in ids}
        missing = [i for i, p in found.items() if p is None]
        if missing:
            return _error(404, f"no run {missing[0]!r}")
        return StrictJSON(config_diff({i: read_config(p) for i, p in found.items()}))

    async def metrics(self, request: Request):
        """?run=ID&offset=BYTES: the metric rows written since `offset`, as columns, with bad or partial lines."""
        found = _run(request, self.registry)
        if isinstance(found, JSONResponse):
            return found
        run_id, file = found[0], safe_file(found[1], METRICS)
        if file is None:
            return StrictJSON({"run": run_id, "offset": 0, "step": [], "series": {}, "bad": [], "partial": None,
                               "reset": False, "missing": True})
        got = self.cache.read(file, _int(request, "offset", 0))
        rows = got.pop("rows")
        return StrictJSON({"run": run_id, **got, **columns(rows)})

    async def groups(self, request: Request):
        """?run=ID: the steps that have group records; with &step=S, that step's groups (a bad line of the step is its
        error in place of a group); `bad`: the lines of no step."""
        found = _run(request, self.registry)
        if isinstance(found, JSONResponse):
            return found
        run_id, file = found[0], safe_file(found[1], GROUPS)
        if file is None:
            return StrictJSON({"run": run_id, "steps": [], "groups": [], "bad": [], "missing": True})
        index, bad = self.index.read(file)
        steps = sorted(index)
        step = _int(request, "step", steps[-1] if steps else 0)
        groups = self.index.groups(file, step) if step in steps else []
        for g in groups:
            g["prompt_text"] = prompt_text(g.get("prompt"))
            for c in g.get("completions") or []:  # an agent's episode: its own prompt, after its environment's reset
                if isinstance(c, dict) and "prompt" in c:
                    c["prompt_text"] = prompt_text(c["prompt"])
        return StrictJSON({"run": run_id, "steps": steps, "step": step, "groups": groups, "bad": bad})

    async def aha(self, request: Request):
        """?run=ID: reflection phrases in the recorded completions, step by step (the run's own phrase list), the
        greedy answers to the same held-out problems at each evaluation, and the problems a reflection fixed; `bad`:
        the lines of groups.jsonl left out (held_out.jsonl's are in `held_out`)."""
        found = _run(request, self.registry)
        if isinstance(found, JSONResponse):
            return found
        phrases = read_config(found[1]).get("reflection_phrases")
        if not (phrases and isinstance(phrases, list) and all(isinstance(p, str) for p in phrases)):
            phrases = list(DEFAULT_REFLECTION_PHRASES)  # none saved, or not a list of words: the defaults, named
        steps, bad = reflection_by_step(safe_file(found[1], GROUPS), phrases, self.index)
        return StrictJSON({"run": found[0], "phrases": phrases, "steps": steps, "bad": bad,
                           "held_out": held_out_table(safe_file(found[1], HELD_OUT)),
                           "moments": aha_moments(safe_file(found[1], HELD_OUT))})

    async def file(self, request: Request):
        """?run=ID&path=REL: a file inside the run's directory, of a type the Runs page links (runs.SERVED_FILES), as
        that type and inert (guard.FILE_CSP): an image to be shown, anything else a download. Anything outside the
        run, or of another type (.html, .svg, .js: pages that would run as this dashboard), is refused (403)."""
        found = _run(request, self.registry)
        if isinstance(found, JSONResponse):
            return found
        target = safe_file(found[1], request.query_params.get("path", ""))
        if target is None:
            return _error(403, "only files inside the run directory are served")
        if target.suffix not in SERVED_FILES:
            return _error(403, f"only {', '.join(SERVED_FILES)} files are served")
        inline = target.suffix in SHOWN_INLINE
        return FileResponse(target, media_type=SERVED_FILES[target.suffix], filename=None if inline else target.name,
                            headers={"Content-Security-Policy": FILE_CSP})

    async def playground_status(self, request: Request):
        earlier = sorted(i for i in self.registry.runs() if i.startswith("playground/"))
        return StrictJSON({**self.playground.status(), "runs": earlier})

    async def page(self, request: Request):
        return FileResponse(STATIC / "index.html")


def make_app(registry: RunRegistry, playground: Playground, host: str = LOCALHOST) -> Starlette:
    """The app: the page at /, its files under /static, the API under /api; `host` is the address it is
    configured to bind (a Host naming it is answered, see guard.py)."""
    api = Api(registry, playground)
    routes = [
        Route("/", api.page), Route("/api/runs", api.runs), Route("/api/metrics", api.metrics),
        Route("/api/groups", api.groups), Route("/api/file", api.file), Route("/api/aha", api.aha),
        Route("/api/config_diff", api.config_diff),
        *[Route(f"/api/learn/{name}", _post(fn), methods=["POST"]) for name, fn in LEARN.items()],
        Route("/api/playground", api.playground_status),
        Route("/api/playground/start", _post(playground.start), methods=["POST"]),
        Route("/api/playground/cancel", _post(lambda body: playground.cancel()), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        playground.close()  # a playground job never outlives the server

    return Starlette(routes=routes, exception_handlers={Exception: _crash}, lifespan=lifespan,
                     middleware=[Middleware(Inert), Middleware(Guard, bind_host=host)])


class Server:
    """uvicorn running `app` in a background thread (for `aha train dashboard=true` and the tests)."""

    def __init__(self, app, host: str = LOCALHOST, port: int = 0):
        import uvicorn
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout_s: float = 10.0) -> str:
        """Start serving; returns the base URL once the socket listens."""
        self.thread.start()
        for _ in range(int(timeout_s / 0.05)):
            if self.server.started:
                break
            threading.Event().wait(0.05)
        if not self.server.started:
            raise RuntimeError("the dashboard server did not start")
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def build(runs: list[str], root: str, playground_dir: str | None, playground_model: str | None,
          playground_steps: int, playground_time_s: float, host: str = LOCALHOST) -> Starlette:
    """The app for run directories `runs` (empty: every run under `root`)."""
    registry = RunRegistry(runs, root)
    pg_dir = Path(playground_dir) if playground_dir else Path(root) / "playground"
    if playground_model is None and (Path(root) / "demo" / "sft" / "model" / "config.json").is_file():
        playground_model = str((Path(root) / "demo" / "sft" / "model").resolve())  # the demo's cold-started model
    return make_app(registry, Playground(pg_dir.resolve(), registry, playground_model, playground_steps,
                                         playground_time_s), host)
