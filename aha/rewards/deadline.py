"""A synchronous reward call on the main thread, bounded: libraries such as math-verify need that thread (their
own time-outs use SIGALRM), so the call cannot simply be abandoned on a helper thread.

A watchdog thread is armed for each call. At `timeout_s` it signals the main thread, whose handler raises
RewardTimeout inside the call. A call that swallows it (a bare `except:`) and runs on past
timeout_s + STUCK_GRACE_S ends the process: one line on stderr names the function, and the exit code is
STUCK_EXIT_CODE. Checkpoints are written atomically, so the ones written so far stay whole.

A stop signal (SIGINT, SIGTERM) whose handler raises inside the call -- the trainer's second signal, a Ctrl-C
outside training -- is the caller's, not the reward's: it is raised again when the call ends, even if the
reward swallowed it, and a call still running STOP_GRACE_S after it ends the process at once.
"""
from __future__ import annotations

import math
import os
import signal
import threading
import time
from typing import Any, Callable


class RewardTimeout(BaseException):
    """A reward call ran past its wall-clock limit. A BaseException, like KeyboardInterrupt, so that a reward
    function's own `except Exception` cannot swallow it."""


WATCHDOG_SIGNAL = signal.SIGUSR2
"""Sent to the main thread when a synchronous reward call runs past its limit (SIGALRM stays free for
libraries such as math-verify, whose own time-outs use it)."""
STUCK_GRACE_S = 10.0
"""How long a reward call may run on after RewardTimeout was raised inside it (time to clean up, e.g. kill a
subprocess) before the watchdog ends the process: only a call that swallowed the timeout gets that far."""
STUCK_EXIT_CODE = 70
"""Exit status when a reward call ignored its time limit (EX_SOFTWARE of sysexits.h)."""
STOP_GRACE_S = 1.0
"""How long a reward call may run on after a stop signal's exception was raised inside it, before the process
ends at once: a second SIGINT/SIGTERM must stop the run even inside a reward that catches everything."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Signals whose handlers may raise to stop the run (the trainer's, Python's KeyboardInterrupt)."""
SIGNAL_EXIT_BASE = 128
"""Shell convention: a process ended by signal N exits with 128 + N."""
STDERR_FD = 2
"""Where the watchdog writes its one line before ending the process."""


class _Watch:
    """One guarded call: its limits, what happened in it, and the watchdog thread that enforces them."""

    def __init__(self, name: str, timeout_s: float):
        self.name, self.timeout_s = name, timeout_s
        self.cut_at = time.monotonic() + timeout_s           # inf: no limit, only stop signals are watched
        self.stop: BaseException | None = None               # a stop signal's exception raised inside the call
        self.stop_at, self.signum = math.inf, 0
        self.sent = self.raised = self.done = False
        self.wake = threading.Event()
        self.previous: dict = {}                              # signal -> the handler to put back
        self.thread = threading.Thread(target=self._watch, daemon=True, name="aha-reward-watchdog")

    def _watch(self) -> None:
        main = threading.main_thread().ident
        while not self.done:
            now = time.monotonic()
            if now >= self.stop_at:
                self._exit(self._stop_code(), f"aha: {str(self.stop) or type(self.stop).__name__}; reward function "
                                              f"{self.name} caught the stop and ran on: process ended")
            if not self.sent and now >= self.cut_at:
                self.sent = True
                signal.pthread_kill(main, WATCHDOG_SIGNAL)
            elif self.sent and now >= self.cut_at + STUCK_GRACE_S:
                self._exit(STUCK_EXIT_CODE, f"aha: reward function {self.name} ignored its time limit "
                                            f"(reward_timeout={self.timeout_s:g} s) and still ran {STUCK_GRACE_S:g} s "
                                            "later (a bare except: or except BaseException swallows the cut): "
                                            "process ended; the checkpoints written so far are intact (resume=true)")
            wait = min(self.stop_at, self.cut_at + (STUCK_GRACE_S if self.sent else 0.0)) - now
            self.wake.wait(wait if math.isfinite(wait) else None)
            self.wake.clear()  # state is re-read after clearing: a change that set it is never missed

    def _stop_code(self) -> int:
        """The exit status the stop would have given (Preempted's 128 + signal), had it not been swallowed."""
        code = getattr(self.stop, "code", None)
        return code if isinstance(code, int) and code else SIGNAL_EXIT_BASE + self.signum

    def _exit(self, code: int, line: str) -> None:
        """End the process now: the main thread is stuck in the reward, so nothing can unwind it."""
        if self.done:
            return
        try:  # a raw write: the main thread may hold the locks of buffered streams
            os.write(STDERR_FD, (line.replace("\n", " ") + "\n").encode())
        finally:
            os._exit(code)

    def _on_cut(self, signum, frame) -> None:
        """The watchdog's signal: raise the cut inside the call, unless the call has just ended."""
        if not self.done:
            self.raised = True
            raise RewardTimeout()

    def _wrap_stop(self, previous: Callable) -> Callable:
        """`previous`, noting an exception it raises inside the call: the reward may swallow it."""
        def on_stop(signum, frame):
            try:
                previous(signum, frame)
            except BaseException as e:
                if not self.done:
                    self.stop, self.signum, self.stop_at = e, signum, time.monotonic() + STOP_GRACE_S
                    self.wake.set()
                raise
        return on_stop

    def arm(self) -> None:
        """Install the handlers (noting the ones to put back) and start the watchdog."""
        self.previous[WATCHDOG_SIGNAL] = signal.signal(WATCHDOG_SIGNAL, self._on_cut)
        for signum in STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):  # SIG_DFL and SIG_IGN act without raising inside the call: left as they are
                self.previous[signum] = signal.signal(signum, self._wrap_stop(handler))
        self.thread.start()

    def disarm(self) -> None:
        self.done = True
        self.wake.set()
        if self.thread.ident is not None:
            self.thread.join()  # before the handlers go back: no watchdog signal may reach the previous one
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def call_bounded(fn: Callable, name: str, timeout_s: float, kwargs: dict) -> Any:
    """fn(**kwargs) on the main thread; what it raised (SystemExit and KeyboardInterrupt included: a reward's
    exit is its failure) is returned, and RewardTimeout when it ran past `timeout_s`, even if it swallowed the
    cut. A stop signal's exception raised inside the call is raised again here."""
    watch = _Watch(name, timeout_s)
    try:
        try:
            watch.arm()  # in the try: a stop or a cut may land while it runs
            outcome = fn(**kwargs)
        except BaseException as e:  # noqa: BLE001 - whatever a reward raises is its own failure
            outcome = e
        watch.done = True  # no call between the reward's end and here: a late cut cannot land outside the try
    finally:
        watch.done = True
        watch.disarm()
    if watch.stop is not None:
        raise watch.stop
    return RewardTimeout() if watch.raised else outcome
