"""Hostile programs against the code sandbox, in every isolation this machine offers (bubblewrap when it runs
here, and always the fallback). Each program would score 1 if its attack worked; contained means reward 0,
a verdict within the time limit, no trace outside the sandbox, and this process alive and untouched.
benchmarks/rewards_bench.py runs the same table and reports the slowest case."""
from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aha.rewards import CodeReward
from aha.rewards.sandbox import Limits, isolation, run_tests

LIMITS = Limits(timeout_s=1.0)
MARGIN_S = 3.0  # sandbox start-up and kill, beyond the time limit
PROJECT_FILE = Path(__file__).resolve().parents[1] / "pyproject.toml"


@dataclass
class Case:
    name: str
    program: str
    tests: list[str] = field(default_factory=list)  # assert statements; each would pass if the attack worked
    io: list[tuple[str, str]] | None = None
    needs_fs: bool = False  # needs a hidden filesystem: bubblewrap, or Landlock in the fallback


def hostile_cases(port: int, escape: str) -> list[Case]:
    """The table. `port`: a listener on 127.0.0.1; `escape`: a host path that must never be created."""
    me = os.getpid()
    content = PROJECT_FILE.read_text()
    ok = ["assert f() == 1"]
    return [
        Case("fork_bomb", "import os\nwhile True:\n    os.fork()\ndef f():\n    return 1\n", ok),
        Case("fork_many", "import os, time\ndef f():\n    n = 0\n    for _ in range(50):\n        try:\n"
             "            if os.fork() == 0:\n                time.sleep(60)\n            n += 1\n"
             "        except OSError:\n            pass\n    return n\n", ["assert f() == 50"]),
        Case("memory_bomb", "x = bytearray(64 << 30)\ndef f():\n    return 1\n", ok),
        Case("memory_growth", "def f():\n    a = []\n    while True:\n        a.append(bytearray(1 << 24))\n", ok),
        Case("infinite_loop", "while True:\n    pass\ndef f():\n    return 1\n", ok),
        Case("sleep_in_test", "import time\ndef f():\n    time.sleep(1000)\n    return 1\n", ok),
        Case("deep_recursion", "import sys\nsys.setrecursionlimit(10 ** 8)\ndef g(n):\n    return g(n + 1) + 1\n"
             "def f():\n    return g(0)\n", ok),
        Case("gigabyte_output", "import sys\nprint('ok')\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))\n",
             io=[("", "ok")]),
        Case("gigabyte_output_calls", "def f():\n    for _ in range(1024):\n        print('x' * (1 << 20))\n    return 2\n",
             ok),
        Case("tcp_connect", f"import socket\ndef f():\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
             "    s.sendall(b'escaped')\n    return 1\n", ok),
        Case("write_outside", f"def f():\n    open({escape!r}, 'w').write('x')\n    return 1\n", ok, needs_fs=True),
        Case("write_project", f"def f():\n    open({str(PROJECT_FILE.parent / ('ESCAPED-' + Path(escape).name))!r}, 'w')"
             ".write('x')\n    return 1\n", ok, needs_fs=True),
        Case("read_project", f"def f():\n    return open({str(PROJECT_FILE)!r}).read()\n",
             [f"assert f() == {content!r}"], needs_fs=True),
        Case("kill_parent", f"import os, signal\ndef f():\n    try:\n        os.kill({me}, signal.SIGUSR1)\n"
             "    except OSError:\n        pass\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 1\n", ok),
        Case("kill_own_group", "import os, signal\ndef f():\n    os.killpg(0, signal.SIGKILL)\n    return 1\n", ok),
        Case("exit_before_tests", "def f():\n    return 1\nexit(0)\n", ok),
        Case("sys_exit_before_tests", "import sys\ndef f():\n    return 1\nsys.exit(0)\n", ok),
        Case("os_exit_before_tests", "import os\ndef f():\n    return 1\nos._exit(0)\n", ok),
        Case("exit_during_tests", "import sys\ndef f():\n    sys.exit(0)\n", ok),
        Case("always_equal_result", "class A:\n    def __eq__(self, other):\n        return True\n"
             "    def __ne__(self, other):\n        return False\ndef f():\n    return A()\n", ok),
        Case("generator_for_tuple", "def f():\n    return (x for x in (0, 1))\n", ["assert f() == (0, 1)"]),
        Case("range_for_tuple", "def f():\n    return range(2)\n", ["assert f() == (0, 1)"]),
        Case("forged_tagged_reply", "import sys\nm = sys.modules['__main__']\nsend = m._send\n"
             "m._send = lambda fd, obj: send(fd, ('ok', (..., 'iter', 5), True) if obj[:1] == ('ok',) else obj)\n"
             "def f():\n    return 1\n", ["assert f() == (..., 'iter', 5) or f() == 5"]),
        Case("forge_report_via_pid1", "import marshal\nfor fd in range(64):\n    try:\n"
             "        open(f'/proc/1/fd/{fd}', 'wb').write(marshal.dumps({'passed': 1, 'total': 1}))\n"
             "    except OSError:\n        pass\ndef f():\n    return 2\n", ok),
        Case("forged_ready_message", "import marshal, os, struct, sys\nd = marshal.dumps(('ready', 5))\n"
             "os.write(int(sys.argv[4]), struct.pack('>I', len(d)) + d)\ndef f():\n    return 2\n", ok),
        Case("shadow_builtin", "def abs(x):\n    return 0\ndef f():\n    return 2\n", ["assert abs(f() - 1) < 1e-9"]),
        Case("shadow_builtin_loop", "def range(*a):\n    return ()\ndef f(x):\n    return 0\n",
             ["for x in range(3):\n    assert f(x) == x + 1"]),
        Case("patch_checker", "import builtins, os, sys\nbuiltins.AssertionError = type('E', (Exception,), {})\n"
             "def check(candidate):\n    pass\nsys.modules['__main__'].__dict__['check'] = check\n"
             "for fd in range(64):\n    try:\n        os.write(fd, b'{\"passed\": 1, \"total\": 1}\\n')\n"
             "    except OSError:\n        pass\ndef f():\n    return 2\n", ok),
        Case("read_checker_memory", "import os\ndef f():\n    with open(f'/proc/{os.getppid()}/mem', 'rb') as m:\n"
             "        m.read(1)\n    return 1\n", ok),
    ]


def _modes() -> list[str]:
    return (["bwrap"] if isolation() == "bwrap" else []) + ["fallback"]


@pytest.fixture(scope="module")
def fallback_strength() -> dict:
    """What the fallback can enforce on this kernel (Landlock, seccomp)."""
    return run_tests("def f():\n    return 1\n", [("assert f() == 1", True)], mode="fallback").detail


@pytest.fixture(scope="module")
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    yield sock
    sock.close()


def _sandbox_descendants() -> list[int]:
    """Processes under this one that look like sandbox harnesses (none may outlive a run)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except (OSError, IndexError, ValueError):
                continue
            if b"_HARNESS_CODE" not in cmd and b"bwrap" not in cmd:
                parents.pop(int(entry))
    out = []
    for pid in parents:
        p, seen = pid, 0
        while p in parents and seen < 64:
            p, seen = parents[p], seen + 1
            if p == os.getpid():
                out.append(pid)
                break
    return out


@pytest.mark.parametrize("mode", _modes())
def test_hostile_programs_are_contained(mode, listener, fallback_strength):
    escape = f"/tmp/aha-escape-{uuid.uuid4().hex}"
    signalled: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: signalled.append(1))
    cases = [c for c in hostile_cases(listener.getsockname()[1], escape)
             if mode == "bwrap" or not c.needs_fs or fallback_strength.get("landlock")]
    # (without Landlock the fallback does not hide the filesystem: documented, and those cases are skipped)

    def run(case: Case):
        start = time.monotonic()
        result = run_tests(case.program, [(t, True) for t in case.tests], io=case.io, limits=LIMITS, mode=mode)
        return case, result, time.monotonic() - start

    try:
        with ThreadPoolExecutor(4) as pool:  # most cases wait on a time limit
            outcomes = list(pool.map(run, cases))
    finally:
        signal.signal(signal.SIGUSR1, previous)
    for case, result, elapsed in outcomes:
        assert result.passed == 0, (case.name, result)
        assert result.status != "error", (case.name, result)
        assert elapsed < LIMITS.timeout_s + MARGIN_S, (case.name, elapsed)
    assert not _sandbox_descendants()
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
    assert not os.path.exists(escape)
    assert not list(PROJECT_FILE.parent.glob("ESCAPED-*"))
    assert signalled == []


def test_fallback_enforces_what_it_reports(fallback_strength):
    """On Linux x86_64/aarch64 the fallback always has seccomp; Landlock depends on the kernel."""
    import platform
    if platform.machine() in ("x86_64", "aarch64"):
        assert fallback_strength["seccomp"] is True
    assert "landlock" in fallback_strength


def test_report_must_be_one_marshal_object_with_this_runs_token():
    """A forged verdict written ahead of the checker's (bwrap's init once held the report pipe as /proc/1/fd/1)
    is refused: one marshal dict with the token, nothing before or after it."""
    import marshal
    from aha.rewards.sandbox import _report
    good = {"passed": 1, "total": 1, "token": "t"}
    assert _report(marshal.dumps(good), "t") == {"passed": 1, "total": 1}
    assert _report(marshal.dumps({"passed": 1, "total": 1}) + marshal.dumps(good), "t") is None
    assert _report(marshal.dumps(good) + b"x", "t") is None
    assert _report(marshal.dumps(good), "u") is None
    assert _report(marshal.dumps([good]), "t") is None and _report(b"", "t") is None


@pytest.mark.parametrize("mode", _modes())
def test_a_failing_program_cannot_turn_its_zero_into_an_error(mode, monkeypatch):
    """A harness "error" is None, which GRPO leaves out of the group: a failing program must not reach it, e.g.
    with an import that raises SystemExit when the checker repeats it. The program's imports reach the checker
    only for harmless modules (an `import venv.__main__` there would run model-chosen code outside seccomp)."""
    from aha.rewards import sandbox
    stubbed = ("```python\nimport sys, types\nsys.modules['unittest.__main__'] = types.ModuleType('stub')\n"
               "import unittest.__main__\nfrom operator import truth as isinstance\ndef f():\n    return 2\n```")
    monkeypatch.setattr(sandbox, "_ISOLATION", mode)
    reward = CodeReward(timeout_s=2.0)
    assert reward(None, [stubbed], tests=[["assert f() == 1", "assert isinstance(f(), str)"]]) == [0.0]
    assert not reward.pop_metrics().get("errors")


def test_code_reward_reports_isolation_and_scores_zero():
    reward = CodeReward(timeout_s=2.0)
    out = reward(None, ["```python\nimport os\ndef f():\n    return 1\nos._exit(0)\n```",
                        "```python\nwhile True:\n    pass\n```"], tests=[["assert f() == 1"]] * 2)
    assert out == [0.0, 0.0]
    metrics = reward.pop_metrics()
    assert metrics[f"sandbox/{reward.isolation}"] == 2
    assert metrics["timeouts"] == 1


def _attacks(victims: dict[str, int], target: str) -> dict[str, str]:
    """Programs that reach another process or a file outside their scratch dir with calls the kill ban and
    Landlock do not cover. Each swallows its errors: what counts is the effect on the target."""
    def program(body: str) -> str:
        return ("import ctypes, fcntl, os, resource, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "def f():\n" + "".join(f"    try:\n        {line}\n    except OSError:\n        pass\n"
                                       for line in body.splitlines()) + "    return 1\n")
    info = "i = (ctypes.c_int * 32)(); i[0] = 9; i[2] = -1"  # si_signo SIGKILL, si_code SI_QUEUE
    nr = {"x86_64": (129, 297), "aarch64": (138, 240)}.get(os.uname().machine, (129, 297))
    asynchronous = "fcntl.fcntl(a.fileno(), fcntl.F_SETFL, fcntl.fcntl(a.fileno(), fcntl.F_GETFL) | os.O_ASYNC)"
    return {
        "rt_sigqueueinfo": program(f"{info}\nlibc.syscall({nr[0]}, {victims['rt_sigqueueinfo']}, 9, i)"),
        "rt_tgsigqueueinfo": program(f"{info}\nv = {victims['rt_tgsigqueueinfo']}\nlibc.syscall({nr[1]}, v, v, 9, i)"),
        "fcntl_setown": program(f"global a, b\na, b = socket.socketpair()\n"
                                f"fcntl.fcntl(a.fileno(), fcntl.F_SETOWN, {victims['fcntl_setown']})\n"
                                f"fcntl.fcntl(a.fileno(), 10, 9)\n{asynchronous}\nb.send(b'x')"),  # F_SETSIG SIGKILL
        "ioctl_fiosetown": program(f"global a, b\na, b = socket.socketpair()\n"
                                   f"fcntl.ioctl(a.fileno(), 0x8901, struct.pack('i', {victims['ioctl_fiosetown']}))\n"
                                   f"{asynchronous}\nb.send(b'x')"),  # SIGIO's default action kills
        "prlimit_other": program(f"resource.prlimit({victims['prlimit_other']}, resource.RLIMIT_CPU, (1, 1))"),
        "metadata_outside": program(f"os.chmod({target!r}, 0o777)\nos.utime({target!r}, (0, 0))\n"
                                    f"os.setxattr({target!r}, 'user.aha', b'x')"),
    }


@pytest.mark.parametrize("mode", _modes())
def test_no_signal_limit_or_metadata_outside_the_candidate(mode, tmp_path):
    """rt_(tg)sigqueueinfo, an owner for SIGIO (fcntl F_SETOWN/F_SETSIG, ioctl FIOSETOWN), prlimit64 on another
    pid and chmod/utime/setxattr (metadata, which Landlock leaves open) reach nothing outside the candidate."""
    import resource
    import subprocess
    target = tmp_path / "outside.txt"
    target.write_text("x")
    os.chmod(target, 0o600)
    before = os.stat(target)
    names = ("rt_sigqueueinfo", "rt_tgsigqueueinfo", "fcntl_setown", "ioctl_fiosetown", "prlimit_other")
    victims = {name: subprocess.Popen(["sleep", "60"]) for name in names}
    try:
        limit = resource.prlimit(victims["prlimit_other"].pid, resource.RLIMIT_CPU)
        programs = _attacks({n: p.pid for n, p in victims.items()}, str(target))
        with ThreadPoolExecutor(4) as pool:
            results = dict(zip(programs, pool.map(
                lambda src: run_tests(src, [("assert f() == 1", True)], limits=LIMITS, mode=mode), programs.values())))
        assert all(r.status != "error" for r in results.values()), results
        time.sleep(0.3)  # a queued signal
        after = os.stat(target)
        reached = {n: p.returncode for n, p in victims.items() if p.poll() is not None}
        if resource.prlimit(victims["prlimit_other"].pid, resource.RLIMIT_CPU) != limit:
            reached["prlimit_other"] = "RLIMIT_CPU changed"
        if (after.st_mode, after.st_mtime_ns, os.listxattr(target)) != (before.st_mode, before.st_mtime_ns, []):
            reached["metadata_outside"] = (oct(after.st_mode), after.st_mtime_ns, os.listxattr(target))
        assert reached == {}
    finally:
        for p in victims.values():
            p.kill()
            p.wait(timeout=30)  # SIGKILL was sent: it ends at once


@pytest.mark.parametrize("mode", _modes())
def test_ordinary_program_keeps_its_own_limits_files_and_fds(mode):
    """The argument checks leave a program its own process and scratch dir: limits, files, fcntl, ioctl."""
    program = ("import fcntl, os, resource\ndef f():\n    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n"
               "    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))\n"
               "    resource.prlimit(0, resource.RLIMIT_NOFILE)\n    with open('scratch.txt', 'w') as out:\n"
               "        out.write('hi')\n    fd = os.open('scratch.txt', os.O_RDONLY)\n"
               "    fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.fcntl(fd, fcntl.F_GETFD) | fcntl.FD_CLOEXEC)\n"
               "    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)\n"
               "    os.isatty(fd)\n    os.close(fd)\n    return open('scratch.txt').read()\n")
    result = run_tests(program, [("assert f() == 'hi'", True)], limits=LIMITS, mode=mode)
    assert result.passed == 1, result
