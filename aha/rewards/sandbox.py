"""The sandbox that runs model-written code against tests.

With bubblewrap (`bwrap`): new user, PID, network, IPC, UTS and cgroup namespaces (no network at all), a
read-only view of only the system and Python directories, one 64 MiB tmpfs scratch directory, no
capabilities, and death with the trainer. Without it (no binary, or unprivileged namespaces are blocked, as in
many containers and on Ubuntu 24.04 runners), the *fallback* runs the same harness directly: the same
resource limits, seccomp (no sockets, so no network; the program cannot fork, exec or signal), and, where the
kernel has Landlock, the same filesystem allow-list (read the system and Python, write the scratch directory).
Both add rlimits on CPU seconds, address space, processes, file size and open files, and a wall-clock kill
of the whole process group. `SandboxResult.isolation` says which one ran; `AHA_SANDBOX=fallback` forces it.

The verdict comes from a checker process that never runs model code (see `_sandbox_harness.py`)."""
from __future__ import annotations

import contextlib
import functools
import logging
import marshal
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from io import BytesIO

logger = logging.getLogger(__name__)

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_harness.py")
STARTUP_GRACE_S = 5.0  # beyond the harness's own deadline before the trainer kills the process group
SCRATCH_BYTES = 64 << 20
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock for the whole run, tests included
    memory_mb: int = 1024  # address space of each sandboxed process
    max_procs: int = 32  # RLIMIT_NPROC (inside bubblewrap; the candidate cannot fork in either mode)
    max_file_mb: int = 16  # largest file the program may write
    max_open_files: int = 64


@dataclass
class SandboxResult:
    passed: int  # tests passed; 0 unless the program was still running when the tests finished
    total: int
    status: str  # "ok", "exited" (the program left or died early), "timeout", "killed" (no report), "error"
    isolation: str  # "bwrap" or "fallback"
    seconds: float
    detail: dict = field(default_factory=dict)


def python_executable() -> str:
    """The base interpreter (not a venv's): the sandbox shows its standard library and nothing else."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _python_dirs() -> list[str]:
    exe_prefix = os.path.dirname(os.path.dirname(python_executable()))
    dirs = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix), exe_prefix}
    return sorted(d for d in dirs if d != "/" and not d.startswith("/usr/"))


def _system_dirs() -> list[str]:
    return [p for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64") if os.path.lexists(p)]


def bwrap_command() -> list[str] | None:
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    # --as-pid-1: the harness itself is pid 1. Else bwrap's own init is, dumpable and holding the report pipe on
    # its fd 1, and the program could write a verdict first through /proc/1/fd/1.
    cmd = [exe, "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1", "--cap-drop", "ALL",
           "--uid", "65534", "--gid", "65534", "--hostname", "sandbox"]
    for path in _system_dirs() + _python_dirs():
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        else:
            cmd += ["--ro-bind", path, path]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(SCRATCH_BYTES), "--tmpfs", "/scratch",
            "--chdir", "/scratch", "--remount-ro", "/", "--clearenv"]
    for k, v in {**SANDBOX_ENV, "HOME": "/scratch", "TMPDIR": "/scratch"}.items():
        cmd += ["--setenv", k, v]
    return cmd


_ISOLATION: str | None = None
_ISOLATION_LOCK = threading.Lock()


def isolation() -> str:
    """"bwrap" when bubblewrap can start a sandbox here (probed once), else "fallback"."""
    global _ISOLATION
    with _ISOLATION_LOCK:
        if _ISOLATION is None:
            forced = os.environ.get("AHA_SANDBOX", "")
            cmd = bwrap_command() if forced != "fallback" else None
            ok = False
            if cmd is not None:
                try:
                    probe = subprocess.run(cmd + [python_executable(), "-I", "-S", "-c", "print('ok')"],
                                           capture_output=True, timeout=30)
                    ok = probe.returncode == 0 and probe.stdout.strip() == b"ok"
                    if not ok:
                        logger.warning("bubblewrap cannot run here (%s); code runs in the fallback sandbox",
                                       probe.stderr.decode(errors="replace").strip()[:200])
                except (OSError, subprocess.TimeoutExpired) as e:
                    logger.warning("bubblewrap cannot run here (%s); code runs in the fallback sandbox", e)
            elif forced != "fallback":
                logger.warning("bubblewrap not found (apt-get install bubblewrap); code runs in the fallback sandbox")
            _ISOLATION = "bwrap" if ok else "fallback"
        return _ISOLATION


@functools.lru_cache(maxsize=1)
def _harness() -> tuple[str, bytes]:
    """(bootstrap source, the harness's code object as marshal data): see BOOTSTRAP in the harness."""
    from . import _sandbox_harness
    with open(HARNESS, encoding="utf-8") as f:
        code = compile(f.read(), HARNESS, "exec")
    return _sandbox_harness.BOOTSTRAP, marshal.dumps(code)


def run_tests(program: str, steps: list[tuple[str, bool]], setup: list[str] = (), bind: dict | None = None,
              io: list[tuple[str, str]] | None = None, limits: Limits = Limits(),
              mode: str | None = None, imports: list[str] = ()) -> SandboxResult:
    """Run `program` in the sandbox against tests and count the passes.

    Function tests: `imports` (the program's own, already limited to harmless modules: see
    `code_tests.program_imports`) run first, then the names the program defines become callable from the tests,
    except builtins' names (a program's `sum` must not change what the tests compute); then `setup` (trusted
    dataset code, whose definitions win), `bind`'s aliases (HumanEval's {"candidate": entry_point}), and each
    (source, is_test) step in order; a step with is_test counts as passed when it raises nothing. IO tests: `io`
    is a list of (stdin, expected stdout). The report must carry this run's random token and be the only thing
    on the checker's stdout: anything else (a verdict forged by the program) scores 0 ("killed").

    >>> run_tests("def add(a, b):\\n    return a + b", [("assert add(2, 3) == 5", True)]).passed
    1
    """
    mode = mode or isolation()
    start = time.monotonic()
    total = len(io) if io is not None else sum(1 for _, is_test in steps if is_test)
    token = secrets.token_hex(16)  # the checker echoes it; the program never sees the request
    req = {"program": program, "imports": list(imports), "setup": list(setup), "steps": [tuple(s) for s in steps],
           "bind": dict(bind or {}), "token": token,
           "io": [tuple(c) for c in io] if io is not None else None, "timeout_s": float(limits.timeout_s),
           "limits": {**asdict(limits), "cpu_s": int(limits.timeout_s) + 1}}
    del req["limits"]["timeout_s"]
    scratch = None
    if mode == "bwrap":
        cmd, cwd, env = bwrap_command() or [], None, None
    else:
        req["limits"]["max_procs"] = 0  # RLIMIT_NPROC counts every process of the user outside a namespace
        scratch = tempfile.mkdtemp(prefix="aha-sandbox-")
        cmd, cwd, env = [], scratch, {**SANDBOX_ENV, "HOME": scratch, "TMPDIR": scratch}
        req["landlock"] = {"read_only": _system_dirs() + _python_dirs() + ["/etc/ld.so.cache", "/dev/urandom"],
                           "read_write": [scratch, "/dev/null"]}
    bootstrap, code = _harness()
    cmd = cmd + [python_executable(), "-I", "-S", "-c", bootstrap, "0"]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=cwd, env=env, start_new_session=True)
        try:
            out, err = proc.communicate(len(code).to_bytes(4, "big") + code + marshal.dumps(req),
                                        timeout=limits.timeout_s + STARTUP_GRACE_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):  # a process that left the group may hold the pipes
                proc.communicate(timeout=STARTUP_GRACE_S)
            return SandboxResult(0, total, "timeout", mode, time.monotonic() - start)
        finally:
            _kill_group(proc)  # anything left in the group (the fallback has no PID namespace to end)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - start
    report = _report(out, token)
    if report is None:
        return SandboxResult(0, total, "killed", mode, seconds, {"stderr": err.decode(errors="replace")[-500:]})
    if "error" in report:
        return SandboxResult(0, total, "error", mode, seconds, report)
    status = "timeout" if report.get("timed_out") else "exited" if report.get("exited") else "ok"
    return SandboxResult(int(report["passed"]), int(report["total"]), status, mode, seconds, report)


def _report(out: bytes, token: str) -> dict | None:
    """The checker's report: exactly one marshal dict carrying this run's token, else None (none, or forged)."""
    stream = BytesIO(out)
    try:
        report = marshal.load(stream)
    except (EOFError, ValueError, TypeError):
        return None
    if stream.tell() != len(out) or not isinstance(report, dict) or report.pop("token", None) != token:
        return None
    return report


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
