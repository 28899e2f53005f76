"""A pool of worker processes whose tasks have a wall-clock limit: a worker that overruns is SIGKILLed and
replaced, so one exponent tower cannot stall the trainer.

Workers are forked from a *zygote*: one interpreter, started once, that imports and warms the heavy libraries
and then forks a worker per request (a few milliseconds, where a fresh interpreter importing sympy takes
seconds). The zygote is a separate program, not a fork of the trainer, which holds CUDA and threads. Each
worker talks JSON lines over its own socket; the zygote reaps the dead ones."""
from __future__ import annotations

import atexit
import json
import logging
import math
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # the zygote imports sympy; on a loaded 2-core machine that can take a while
CRASH_RETRIES = 1
"""Tries a task gets beyond one per worker: killing every worker at once (from outside) must not fail a task
that was handed to each dying one in turn, while a task that itself kills its worker is still reported."""


def default_size() -> int:
    """One worker per usable core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class _Zygote:
    """The process that forks workers: `fork()` hands it one end of a new socket pair, gets the worker's pid."""

    def __init__(self, argv: list[str]):
        self.ctl, theirs = socket.socketpair()
        self.proc = subprocess.Popen(argv, stdin=theirs, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)  # no SIGINT from the terminal's Ctrl-C
        theirs.close()
        self.ctl.settimeout(START_TIMEOUT_S)
        self.reader = self.ctl.makefile("rb")
        if self.reader.readline().strip() != b"ready":
            raise OSError(f"worker zygote {argv} did not start")

    def fork(self) -> tuple[int, socket.socket]:
        ours, theirs = socket.socketpair()
        try:
            socket.send_fds(self.ctl, [b"fork"], [theirs.fileno()])
            pid = int(self.reader.readline())
        except (OSError, ValueError):
            ours.close()
            raise OSError("worker zygote is gone") from None
        except BaseException:  # cut short before the reply: the next fork would read this pid, so start afresh
            ours.close()
            self.close()
            raise
        finally:
            theirs.close()
        return pid, ours

    def close(self) -> None:
        for closing in (self.reader.close, self.ctl.close, self.proc.kill, self.proc.wait):
            try:
                closing()
            except OSError:
                pass


class _Worker:
    def __init__(self, pid: int, sock: socket.socket):
        self.pid, self.sock = pid, sock
        self.fd = sock.fileno()
        sock.setblocking(False)
        self.buf = b""
        self.ready = False
        self.dead = False  # saw end of file: reaped by the zygote, its pid may already be someone else's
        self.task: int | None = None  # index of the task in flight
        self.deadline = 0.0

    def send(self, obj: Any) -> None:
        self.sock.setblocking(True)
        try:
            self.sock.sendall((json.dumps(obj) + "\n").encode())
        finally:
            self.sock.setblocking(False)

    def read_lines(self) -> list[bytes] | None:
        """Complete lines available now; None at end of file (the worker died)."""
        try:
            chunk = self.sock.recv(1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            chunk = b""
        if not chunk:
            self.dead = True
            return None
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return lines

    def kill(self) -> None:
        if not self.dead:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        self.sock.close()


class _Run:
    """The state of one `WorkerPool.map` call: which tasks wait, run, crashed or finished."""

    def __init__(self, pool: "WorkerPool", tasks: list[Any], timeout_s: float, budget_end: float):
        self.pool, self.tasks, self.timeout_s, self.budget_end = pool, tasks, timeout_s, budget_end
        self.results: list[tuple[str, Any] | None] = [None] * len(tasks)
        self.todo = list(range(len(tasks)))[::-1]  # pop() takes from the front of the batch
        self.crashes = [0] * len(tasks)
        self.stillborn = 0  # workers that died before saying ready
        self.latency: list[float | None] = [None] * len(tasks)  # seconds from hand-out to reply
        self.sel = selectors.DefaultSelector()
        for w in pool._workers:
            self.sel.register(w.fd, selectors.EVENT_READ, w)
        for w in list(pool._workers):  # killed while idle since the last call: replaced before it gets a task
            self.read(w)
        while len(pool._workers) < pool.size and self.spawn():
            pass

    def spawn(self) -> bool:
        w = self.pool._spawn()
        if w is not None:
            self.pool._workers.append(w)
            self.sel.register(w.fd, selectors.EVENT_READ, w)
        return w is not None

    def replace(self, w: _Worker) -> None:
        self.sel.unregister(w.fd)
        w.kill()
        self.pool._workers.remove(w)
        self.spawn()

    def hand_out(self) -> None:
        for w in list(self.pool._workers):
            if w.ready and w.task is None and self.todo:
                # Marked busy before the send: a call cut short mid-send must not leave it looking idle.
                w.task, w.deadline = self.todo.pop(), time.monotonic() + self.timeout_s
                try:
                    w.send(self.tasks[w.task])
                except OSError:  # died while idle; the task waits for the next worker
                    self.todo.append(w.task)
                    w.dead = True
                    self.replace(w)

    def read(self, w: _Worker) -> None:
        lines = w.read_lines()
        if lines is None:  # end of file: the worker is gone
            self.stillborn += not w.ready
            if w.task is not None:
                self.crashes[w.task] += 1
                if self.crashes[w.task] < self.pool.size + CRASH_RETRIES:  # perhaps killed from outside: try again
                    self.todo.append(w.task)
                else:
                    self.results[w.task] = ("crash", None)
            self.replace(w)
            return
        for line in lines:
            if not w.ready:
                w.ready = line.strip() == b"ready"
            elif w.task is not None:
                try:
                    self.results[w.task] = ("ok", json.loads(line))
                except ValueError:
                    self.results[w.task] = ("crash", None)
                self.latency[w.task] = time.monotonic() - (w.deadline - self.timeout_s)
                w.task = None

    def expire(self, now: float) -> None:
        """Kill the workers whose task ran past its own limit."""
        for w in list(self.pool._workers):
            if w.task is not None and now > w.deadline:
                self.results[w.task] = ("timeout", None)
                self.replace(w)

    def abort(self, now: float) -> None:
        """The call's budget ran out (or no worker can run): what is not finished is unjudged (or an error)."""
        over = now > self.budget_end
        for w in [w for w in self.pool._workers if w.task is not None]:
            self.results[w.task] = ("unjudged", None) if over else ("timeout", None)
            self.replace(w)
        for i in self.todo:
            self.results[i] = ("unjudged", None) if over else ("error", None)


class WorkerPool:
    """`map(tasks, timeout_s)` runs JSON tasks on the workers and returns, per task, ("ok", reply),
    ("timeout", None) when it ran past `timeout_s` of its own wall clock, ("unjudged", None) when the call ran
    past `budget_s` before it finished,
    ("crash", None) when its worker died twice, or ("error", None) when no worker could be started.
    Thread-safe (calls are serialised); reusable; shut down at interpreter exit."""

    def __init__(self, argv: list[str], size: int | None = None):
        self.argv = list(argv)
        self.size = size or default_size()
        self._zygote: _Zygote | None = None
        self._workers: list[_Worker] = []
        self.last_latencies: list[float | None] = []
        """Seconds from hand-out to reply of each task of the latest map (None: no reply), for benchmarks."""
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # The zygote dies with the thread that started it (PR_SET_PDEATHSIG), so one long-lived thread starts
        # it: not whichever short-lived thread happened to call map().
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="aha-pool-spawner")
        atexit.register(self.close)

    def map(self, tasks: list[Any], timeout_s: float, budget_s: float = math.inf) -> list[tuple[str, Any]]:
        with self._lock:
            return self._map(tasks, timeout_s, time.monotonic() + budget_s)

    def _spawn(self) -> _Worker | None:
        for _ in range(2):  # a dead zygote is restarted once
            try:
                if self._zygote is None:
                    self._zygote = self._spawner.submit(_Zygote, self.argv).result()
                return _Worker(*self._zygote.fork())
            except OSError as e:
                logger.warning("%s; restarting it", e)
                if self._zygote is not None:
                    self._zygote.close()
                self._zygote = None
        logger.error("cannot start workers for %s", self.argv)
        return None

    def _map(self, tasks: list[Any], timeout_s: float, budget_end: float) -> list[tuple[str, Any]]:
        run = _Run(self, tasks, timeout_s, budget_end)
        try:
            while run.todo or any(w.task is not None for w in self._workers):
                now = time.monotonic()
                if not self._workers or now > budget_end or run.stillborn > len(tasks) + self.size:
                    run.abort(now)
                    break
                run.hand_out()
                waits = [budget_end - now] + [w.deadline - now for w in self._workers if w.task is not None]
                for key, _ in run.sel.select(timeout=max(0.0, min(waits + [1.0]))):
                    run.read(key.data)
                run.expire(time.monotonic())
        except BaseException:  # cut short (reward_timeout, Ctrl-C): a task still running belongs to no later call
            for w in [w for w in self._workers if w.task is not None]:
                w.kill()
                self._workers.remove(w)  # the next call starts its replacement
            raise
        finally:
            run.sel.close()
        self.last_latencies = run.latency
        return [r if r is not None else ("error", None) for r in run.results]

    def close(self) -> None:
        if os.getpid() != self._pid:  # a forked child must not kill its parent's workers
            return
        for w in self._workers:
            w.kill()
        self._workers.clear()
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
