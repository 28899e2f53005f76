"""Runs inside the code sandbox (standard library only: the sandbox shows no site-packages and no project).

Two roles. The *checker* (default) reads a marshal request on stdin, runs the tests, and writes one report on
its stdout when they are done. It never executes model code: it starts the *candidate* (argv[2] ==
"candidate"), which executes the program and answers calls to its functions with plain data (marshal) over a
pipe, while the test code runs in the checker against proxies. So a program that exits early, kills its
parent, patches builtins or the checker, or returns an object whose `__eq__` is always True cannot reach the
verdict: it can answer wrongly, or leave, die or kill the checker before the tests end, which scores 0. The
tests see the program's functions under their names, but never in place of a builtin or a helper the dataset
defines, and the program's imports are repeated beside them only for harmless modules (code_tests.SAFE_IMPORTS).

Both roles harden themselves first: resource limits, no new privileges, no capabilities, a seccomp filter
(no sockets, no ptrace; the candidate also cannot fork, exec, signal other processes or leave its process
group) and, when asked (the fallback without bubblewrap), a Landlock filesystem allow-list.
"""
import builtins
import ctypes
import marshal
import os
import resource
import select
import struct
import sys
import time

MAX_MESSAGE = 64 << 20  # bytes in one candidate reply

# How both roles start: `python -I -S -c BOOTSTRAP <fd> <role args>` reads this file's code object, compiled once
# by the trainer (same interpreter), from <fd> and runs it; compiling the source in every process cost more
# than most test runs.
BOOTSTRAP = """import marshal, os, sys
_fd = int(sys.argv[1])
_n = int.from_bytes(os.read(_fd, 4), "big")
_HARNESS_CODE = b""
while len(_HARNESS_CODE) < _n:
    _chunk = os.read(_fd, _n - len(_HARNESS_CODE))
    if not _chunk:
        raise SystemExit(1)
    _HARNESS_CODE += _chunk
exec(marshal.loads(_HARNESS_CODE))
"""

# --------------------------------------------------------------------------- hardening

# Syscall numbers (x86_64, aarch64). Denied with EPERM unless noted.
_SYSCALLS = {
    "x86_64": dict(socket=41, ptrace=101, process_vm_readv=310, process_vm_writev=311, io_uring_setup=425,
                   mount=165, umount2=166, pivot_root=155, chroot=161, unshare=272, setns=308, bpf=321,
                   perf_event_open=298, userfaultfd=323, keyctl=250, add_key=248, request_key=249, kexec_load=246,
                   kexec_file_load=320, init_module=175, finit_module=313, delete_module=176, reboot=169,
                   swapon=167, swapoff=168, iopl=172, ioperm=173, acct=163, open_tree=428, move_mount=429,
                   fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, name_to_handle_at=303,
                   open_by_handle_at=304, kill=62, tkill=200, tgkill=234, pidfd_open=434, pidfd_send_signal=424,
                   pidfd_getfd=438, fork=57, vfork=58, clone=56, clone3=435, execve=59, execveat=322, setsid=112,
                   setpgid=109, rt_sigqueueinfo=129, rt_tgsigqueueinfo=297, prlimit64=302, fcntl=72, chmod=90,
                   fchmod=91, fchmodat=268, fchmodat2=452, chown=92, fchown=93, lchown=94, fchownat=260, utime=132,
                   utimes=235, utimensat=280, futimesat=261, setxattr=188, lsetxattr=189, fsetxattr=190,
                   removexattr=197, lremovexattr=198, fremovexattr=199, ioctl=16),
    "aarch64": dict(socket=198, ptrace=117, process_vm_readv=270, process_vm_writev=271, io_uring_setup=425,
                    mount=40, umount2=39, pivot_root=41, chroot=51, unshare=97, setns=268, bpf=280,
                    perf_event_open=241, userfaultfd=282, keyctl=219, add_key=217, request_key=218, kexec_load=104,
                    kexec_file_load=294, init_module=105, finit_module=273, delete_module=106, reboot=142,
                    swapon=224, swapoff=225, acct=89, open_tree=428, move_mount=429, fsopen=430, fsconfig=431,
                    fsmount=432, fspick=433, mount_setattr=442, name_to_handle_at=264, open_by_handle_at=265,
                    kill=129, tkill=130, tgkill=131, pidfd_open=434, pidfd_send_signal=424, pidfd_getfd=438,
                    clone=220, clone3=435, execve=221, execveat=281, setsid=157, setpgid=154, rt_sigqueueinfo=138,
                    rt_tgsigqueueinfo=240, prlimit64=261, fcntl=25, fchmod=52, fchmodat=53, fchmodat2=452,
                    fchown=55, fchownat=54, utimensat=88, setxattr=5, lsetxattr=6, fsetxattr=7, removexattr=14,
                    lremovexattr=15, fremovexattr=16, ioctl=29),  # no legacy chmod, chown, lchown, utime(s), futimesat
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_BOTH_DENY = ("socket", "ptrace", "process_vm_readv", "process_vm_writev", "io_uring_setup", "mount", "umount2",
              "pivot_root", "chroot", "unshare", "setns", "bpf", "perf_event_open", "userfaultfd", "keyctl",
              "add_key", "request_key", "kexec_load", "kexec_file_load", "init_module", "finit_module",
              "delete_module", "reboot", "swapon", "swapoff", "iopl", "ioperm", "acct", "open_tree", "move_mount",
              "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at")
_CANDIDATE_DENY = ("kill", "tkill", "tgkill", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "fork", "vfork",
                   "execve", "execveat", "setsid", "setpgid", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
                   # metadata of files outside the scratch dir (Landlock does not cover it)
                   "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime",
                   "utimes", "utimensat", "futimesat", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
                   "lremovexattr", "fremovexattr")
# fcntl commands that make the kernel signal another process (SIGIO, or any signal via F_SETSIG), and the
# socket ioctls that set the same owner (FIOSETOWN, SIOCSPGRP: SIGIO kills a process that does not handle it)
_F_SETOWN, _F_SETSIG, _F_SETOWN_EX, _FIOSETOWN, _SIOCSPGRP = 8, 10, 15, 0x8901, 0x8902
_EPERM, _ENOSYS, _CLONE_THREAD = 1, 38, 0x00010000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _prctl(option, *args):
    args = (args + (0, 0, 0, 0))[:4]  # unused arguments must be zero, not register garbage
    return _libc.prctl(ctypes.c_int(option), *(ctypes.c_ulong(a) for a in args))


def _seccomp(deny, candidate):
    """Install a filter denying `deny`; for the candidate also process creation (threads stay allowed)."""
    arch = os.uname().machine
    table = _SYSCALLS.get(arch)
    if table is None:
        return False
    ins = []

    def op(code, k, jt=0, jf=0):
        ins.append(struct.pack("HBBI", code, jt, jf, k))

    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    allow, errno, kill = 0x7FFF0000, 0x00050000, 0x80000000
    op(ld, 4)  # seccomp_data.arch
    op(jeq, _AUDIT_ARCH[arch], jt=1)
    op(ret, kill)  # another ABI (i386 via int 0x80) would dodge the numbers below
    op(ld, 0)  # seccomp_data.nr
    if arch == "x86_64":
        op(jge, 0x40000000, jf=1)  # the x32 ABI
        op(ret, errno | _EPERM)
    for name in deny:
        if name in table:
            op(jeq, table[name], jf=1)
            op(ret, errno | _EPERM)
    if candidate:  # argument checks: each block ends in a return (the accumulator no longer holds nr)
        op(jeq, table["prlimit64"], jf=4)
        op(ld, 16)  # args[0] (low 32 bits): pid; 0 is this process (resource.setrlimit, glibc)
        op(jeq, 0, jf=1)
        op(ret, allow)
        op(ret, errno | _EPERM)  # another process's limits
        op(jeq, table["fcntl"], jf=6)
        op(ld, 24)  # args[1]: cmd
        op(jeq, _F_SETOWN, jt=3)
        op(jeq, _F_SETOWN_EX, jt=2)
        op(jeq, _F_SETSIG, jt=1)
        op(ret, allow)
        op(ret, errno | _EPERM)
        op(jeq, table["ioctl"], jf=5)
        op(ld, 24)  # args[1]: request
        op(jeq, _FIOSETOWN, jt=2)
        op(jeq, _SIOCSPGRP, jt=1)
        op(ret, allow)
        op(ret, errno | _EPERM)
        op(jeq, table["clone3"], jf=1)
        op(ret, errno | _ENOSYS)  # glibc then falls back to clone(), checked below
        op(jeq, table["clone"], jf=4)
        op(ld, 16)  # args[0]: clone flags
        op(jset, _CLONE_THREAD, jf=1)
        op(ret, allow)  # a thread
        op(ret, errno | _EPERM)  # a process
    op(ret, allow)
    code = b"".join(ins)
    buf = ctypes.create_string_buffer(code)

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(code) // 8, ctypes.addressof(buf))
    return _prctl(22, 2, ctypes.addressof(prog)) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _syscall(*args):
    return _libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))


def _landlock(read_only, read_write):
    """Allow reading (and executing) only under `read_only` and writing only under `read_write`."""
    syscall = _syscall
    abi = syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return False
    handled = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        handled |= 1 << 13  # refer
    if abi >= 3:
        handled |= 1 << 14  # truncate
    file_rights = 1 | 2 | 4 | (1 << 14)  # rights that apply to a file (not a directory)
    ro = 1 | 4 | 8  # execute, read_file, read_dir

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = ctypes.c_uint64(handled)
    ruleset = syscall(444, ctypes.byref(attr), 8, 0)  # landlock_create_ruleset
    if ruleset < 0:
        return False
    for paths, rights in ((read_only, ro), (read_write, handled)):
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            allowed = rights & handled if os.path.isdir(path) else rights & handled & file_rights
            rule = PathBeneath(allowed, fd)
            syscall(445, ruleset, 1, ctypes.byref(rule), 0)  # landlock_add_rule(PATH_BENEATH)
            os.close(fd)
    ok = syscall(446, ruleset, 0) == 0  # landlock_restrict_self
    os.close(ruleset)
    return ok


def _drop_capabilities():
    for cap in range(64):  # the bounding set, so that exec cannot bring them back (needs CAP_SETPCAP; else no-op)
        if _prctl(24, cap) != 0 and ctypes.get_errno() == 22:  # PR_CAPBSET_DROP; EINVAL past the last cap
            break

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    _libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)())  # _LINUX_CAPABILITY_VERSION_3, all zero


def harden(limits, role, landlock=None):
    """Limits, then privileges, then filters; returns what took effect."""
    for what, value in ((resource.RLIMIT_AS, limits["memory_mb"] << 20), (resource.RLIMIT_CPU, limits["cpu_s"]),
                        (resource.RLIMIT_FSIZE, limits["max_file_mb"] << 20),
                        (resource.RLIMIT_NOFILE, limits["max_open_files"]), (resource.RLIMIT_CORE, 0),
                        (resource.RLIMIT_NPROC, limits["max_procs"])):
        if value:
            resource.setrlimit(what, (value, value + (what == resource.RLIMIT_CPU)))  # SIGXCPU, then SIGKILL
    _prctl(4, 0)  # PR_SET_DUMPABLE 0: no /proc/<pid>/mem or fd access into this process
    _prctl(38, 1)  # PR_SET_NO_NEW_PRIVS
    _drop_capabilities()
    info = {}
    if landlock:
        info["landlock"] = _landlock(landlock["read_only"], landlock["read_write"])
    candidate = role == "candidate"
    info["seccomp"] = _seccomp(_BOTH_DENY + (_CANDIDATE_DENY if candidate else ()), candidate)
    return info


# --------------------------------------------------------------------------- candidate

def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _send(fd, obj):
    data = marshal.dumps(obj)
    _write_all(fd, struct.pack(">I", len(data)) + data)


def _read_exact(fd, n, deadline):
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(fd, deadline=None):
    (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if n > MAX_MESSAGE:
        raise EOFError
    return marshal.loads(_read_exact(fd, n, deadline))


_LIMIT_KEYS = ("memory_mb", "cpu_s", "max_file_mb", "max_open_files", "max_procs")
_SCALARS = (type(None), bool, int, float, complex, str, bytes)


_MARK = Ellipsis  # tags a range or an iterator in plain data; _plain refuses a bare `...`, so no value looks like one
MAX_DEPTH = 64


def _plain(x, marks, depth=0):
    """`x` as plain data for marshal, keeping equality as Python has it: a Counter or OrderedDict becomes a dict
    and a namedtuple a tuple (each compares equal to those already). A range or an iterator (a generator, map,
    zip...) cannot cross as itself: it goes as a tagged tuple, (_MARK, "range", start, stop, step) or
    (_MARK, "iter", items), appending to `marks`, and `_unplain` rebuilds a range or an iterator over the items
    on the other side, so it compares as Python would (a range equals only an equal range, an iterator only
    itself), never as a tuple or list. Anything else (an object with its own __eq__) is refused."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    t = type(x)
    if t in _SCALARS:
        return x
    if isinstance(x, dict):
        return {_plain(k, marks, depth + 1): _plain(v, marks, depth + 1) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v, marks, depth + 1) for v in x]
    if isinstance(x, tuple):
        return tuple(_plain(v, marks, depth + 1) for v in x)
    if t is range:
        marks.append(t)
        return (_MARK, "range", x.start, x.stop, x.step)
    if hasattr(t, "__next__"):
        marks.append(t)
        return (_MARK, "iter", tuple(_plain(v, marks, depth + 1) for v in x))
    if isinstance(x, frozenset):
        return frozenset(_plain(v, marks, depth + 1) for v in x)
    if isinstance(x, set):
        return {_plain(v, marks, depth + 1) for v in x}
    for base in _SCALARS[2:]:
        if isinstance(x, base):
            return base(x)
    raise ValueError(f"{t.__name__} is not plain data")


def _unplain(x, depth=0):
    """What `_plain` sent, with its tagged ranges and iterators rebuilt. The other side may be the model's
    process, so anything malformed is refused (ValueError), never guessed at."""
    if depth > 2 * MAX_DEPTH + 4:
        raise ValueError("nested too deeply")
    t = type(x)
    if t is tuple:
        if x and x[0] is _MARK:
            if len(x) == 5 and x[1] == "range" and all(type(v) is int for v in x[2:]) and x[4] != 0:
                return range(x[2], x[3], x[4])
            if len(x) == 3 and x[1] == "iter" and type(x[2]) is tuple:
                return iter(tuple(_unplain(v, depth + 1) for v in x[2]))
            raise ValueError("malformed tagged value")
        return tuple(_unplain(v, depth + 1) for v in x)
    if t is list:
        return [_unplain(v, depth + 1) for v in x]
    if t is dict:
        return {_unplain(k, depth + 1): _unplain(v, depth + 1) for k, v in x.items()}
    if t is frozenset:
        return frozenset(_unplain(v, depth + 1) for v in x)
    if t is set:
        return {_unplain(v, depth + 1) for v in x}
    if t in _SCALARS:
        return x
    raise ValueError(f"{t.__name__} is not plain data")


def candidate():
    mode, rfd, wfd = sys.argv[3], int(sys.argv[1]), int(sys.argv[4])
    harden(dict(zip(_LIMIT_KEYS, map(int, sys.argv[5].split(",")))), "candidate")
    program = _recv(rfd)
    builtins.exit = builtins.quit = sys.exit  # what `site` would add; -S leaves them out
    ns = {"__name__": "__main__" if mode == "io" else "solution", "__builtins__": builtins}
    if mode == "io":
        exec(compile(program, "solution.py", "exec"), ns)
        return
    try:
        exec(compile(program, "solution.py", "exec"), ns)
    except BaseException as e:  # noqa: BLE001 - includes SystemExit: leaving before the tests is failing them
        _send(wfd, ("dead", type(e).__name__))
        os._exit(1)
    _send(wfd, ("ready", [k for k, v in list(ns.items()) if callable(v) and not k.startswith("__")]))
    while True:
        try:
            msg = _recv(rfd)
        except EOFError:
            os._exit(0)
        if msg == "ping":
            _send(wfd, "pong")
            continue
        name, args, kwargs, marked = msg
        try:
            if marked:
                args, kwargs = _unplain(args), _unplain(kwargs)
            marks = []
            result = ("ok", _plain(ns[name](*args, **kwargs), marks), bool(marks))
        except SystemExit:
            _send(wfd, ("dead", "SystemExit"))
            os._exit(1)
        except BaseException as e:  # noqa: BLE001
            result = ("raise", type(e).__name__, str(e)[:300])
        try:
            _send(wfd, result)
        except ValueError:  # unmarshallable after all
            _send(wfd, ("raise", "TypeError", "the result is not plain data"))


# --------------------------------------------------------------------------- checker

class CandidateGone(Exception):
    """The candidate process died, left, or ran out of time: every test from here on fails."""


class Candidate:
    """The process running the program; spawned without `subprocess`, whose import costs more than the run."""

    def __init__(self, req, mode, deadline, stdin=None, stdout=None):
        self.deadline = deadline
        self.timed_out = self.gone = False
        a2b, self.w = os.pipe()
        self.r, b2a = os.pipe()
        limits = ",".join(str(req["limits"][k]) for k in _LIMIT_KEYS)
        argv = [sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(a2b), "candidate", mode, str(b2a), limits]
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (a2b, b2a):
            os.set_inheritable(fd, True)
        actions = [(os.POSIX_SPAWN_DUP2, null if stdin is None else stdin, 0),
                   (os.POSIX_SPAWN_DUP2, null if stdout is None else stdout, 1), (os.POSIX_SPAWN_DUP2, null, 2)]
        self.pid = os.posix_spawn(sys.executable, argv, os.environ, file_actions=actions)
        for fd in (a2b, b2a, null):
            os.close(fd)
        try:
            os.write(self.w, len(_HARNESS_CODE).to_bytes(4, "big"))
            _write_all(self.w, _HARNESS_CODE)
            _send(self.w, req["program"])
        except OSError:  # died on the way up
            self.kill()

    def names(self):
        """Wait for the program to load; its callable names, or None if it never got there."""
        try:
            reply = _recv(self.r, self.deadline)
        except TimeoutError:
            self.kill(timed_out=True)
            return None
        except (EOFError, ValueError, struct.error):
            reply = None
        if not (isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "ready"
                and isinstance(reply[1], (list, tuple))):
            self.kill()
            return None
        return [n for n in reply[1] if isinstance(n, str)]

    def call(self, name, args, kwargs):
        if self.gone:
            raise CandidateGone
        marks = []
        try:
            message = (name, _plain(args, marks), _plain(kwargs, marks), bool(marks))
        except ValueError:  # not plain data: as marshal takes it, or not at all
            message = (name, args, kwargs, False)
        try:
            _send(self.w, message)
        except ValueError:
            raise TypeError("the arguments are not plain data") from None
        except OSError:
            self.kill()
            raise CandidateGone from None
        try:
            reply = _recv(self.r, self.deadline)
        except TimeoutError:
            self.kill(timed_out=True)
            raise CandidateGone from None
        except (EOFError, ValueError, struct.error, OSError):
            reply = None
        if isinstance(reply, tuple) and len(reply) == 3 and reply[0] == "ok":
            if reply[2] is not True:
                return reply[1]
            try:
                return _unplain(reply[1])
            except (ValueError, TypeError, RecursionError, MemoryError):
                raise TypeError("the result is not plain data") from None
        if isinstance(reply, tuple) and len(reply) == 3 and reply[0] == "raise":
            exc = getattr(builtins, str(reply[1]), None)
            if not (isinstance(exc, type) and issubclass(exc, Exception)):
                exc = RuntimeError
            raise exc(str(reply[2]))
        self.kill()
        raise CandidateGone

    def alive_at_end(self):
        """A final round trip: the program must still be there after the last test."""
        if self.gone:
            return False
        try:
            _send(self.w, "ping")
            ok = _recv(self.r, self.deadline) == "pong"
        except TimeoutError:
            self.kill(timed_out=True)
            return False
        except (EOFError, ValueError, struct.error, OSError):
            ok = False
        self.kill()
        return ok

    def kill(self, timed_out=False):
        self.timed_out |= timed_out
        if self.gone:
            return
        self.gone = True
        try:
            os.kill(self.pid, 9)  # SIGKILL (the signal module costs an enum import)
        except OSError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.w)
        os.close(self.r)


_BUILTIN_NAMES = frozenset(vars(builtins))


def _binds_freely(name):
    """Whether a name from the program may be bound where the tests run: never over a builtin (a program's `sum`,
    `range` or `isinstance` would change what the tests compute) nor a dunder."""
    return isinstance(name, str) and name not in _BUILTIN_NAMES and not name.startswith("__")


def _run(src, ns, filename):
    """Execute `src` in `ns`; True when it raised nothing. BaseException is caught too: nothing may end the
    checker early (a SystemExit would turn a failing program's 0 into an "error", which GRPO leaves out)."""
    try:
        exec(compile(src, filename, "exec"), ns)
        return True
    except BaseException:  # noqa: BLE001 - a failed test or a broken import, whatever it raised
        return False


def run_calls(req, deadline):
    cand = Candidate(req, "calls", deadline)
    total = sum(1 for _, is_test in req["steps"] if is_test)
    try:
        return _run_calls(req, cand, total)
    except BaseException:  # noqa: BLE001 - anything the program provoked here fails its tests; never an "error"
        cand.kill()
        return {"passed": 0, "total": total, "exited": not cand.timed_out, "timed_out": cand.timed_out}


def _run_calls(req, cand, total):
    names = cand.names()
    if names is None:
        return {"passed": 0, "total": total, "exited": not cand.timed_out, "timed_out": cand.timed_out}

    def proxy(name):
        def call(*args, **kwargs):
            return cand.call(name, args, kwargs)
        call.__name__ = name
        return call

    imported = {"__builtins__": builtins}
    for src in req.get("imports", ()):  # the program's own, of harmless modules only (code_tests.program_imports)
        _run(src, imported, "<imports>")
    ns = {k: v for k, v in imported.items() if _binds_freely(k)}
    ns.update({"__name__": "__aha_tests__", "__builtins__": builtins})
    ns.update({name: proxy(name) for name in names if _binds_freely(name)})  # the program's own names win
    for src in req["setup"]:  # trusted: the prompt's helpers, the test module's (theirs win over the program's)
        _run(src, ns, "<setup>")
    ns.update({alias: proxy(target) for alias, target in req["bind"].items()})
    passed = 0
    for src, is_test in req["steps"]:
        if cand.gone:
            break
        if _run(src, ns, "<tests>"):
            passed += bool(is_test)
    alive = cand.alive_at_end()
    return {"passed": passed if alive else 0, "total": total, "exited": not alive and not cand.timed_out,
            "timed_out": cand.timed_out}


def _same_output(got, want):
    """Exact, except for whitespace at the ends of lines and of the whole output."""
    def lines(s):
        return [line.rstrip() for line in s.replace("\r\n", "\n").rstrip().split("\n")]
    return lines(got) == lines(want)


def run_io(req, deadline):
    passed = 0
    timed_out = False
    outputs = []  # what each run wrote (at most its cap): a code tool shows it to the model
    for stdin_text, expected in req["io"]:
        limit = cap = len(expected.encode()) + 4096  # bytes of output read at most
        in_r, in_fd = os.pipe()
        out_fd, out_w = os.pipe()
        cand = Candidate(req, "io", deadline, stdin=in_r, stdout=out_w)
        os.close(in_r)
        os.close(out_w)
        pending = stdin_text.encode()
        out, too_long = [], False
        os.set_blocking(in_fd, False)
        if not pending:  # end of input right away, or a program reading stdin waits forever
            os.close(in_fd)
            in_fd = None
        while not cand.gone:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            readable, writable, _ = select.select([out_fd], [in_fd] if pending else [], [], left)
            if writable:
                try:
                    pending = pending[os.write(in_fd, pending[:1 << 16]):]
                except OSError:  # the program stopped reading
                    pending = b""
                if not pending:
                    os.close(in_fd)
                    in_fd = None
            if readable:
                chunk = os.read(out_fd, 1 << 16)
                if not chunk:
                    break
                out.append(chunk)
                cap -= len(chunk)
                if cap < 0:
                    too_long = True
                    break
        cand.kill()
        for fd in (in_fd, out_fd):
            if fd is not None:
                os.close(fd)
        outputs.append(b"".join(out)[:limit].decode("utf-8", "replace"))
        if not too_long and not timed_out:
            passed += _same_output(b"".join(out).decode("utf-8", "replace"), expected)
        if timed_out:
            break
    return {"passed": passed, "total": len(req["io"]), "exited": False, "timed_out": timed_out, "outputs": outputs}


def _read_rest(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def checker():
    """Request and report are marshal data: the trainer runs this same interpreter, and `json` costs more to
    import than a test takes to run."""
    req = marshal.loads(_read_rest(0))
    deadline = time.monotonic() + req["timeout_s"]
    report = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the test code's prints must not reach the report
        os.dup2(null, fd)
    try:
        info = harden(req["limits"], "checker", req.get("landlock"))
        result = run_io(req, deadline) if req.get("io") is not None else run_calls(req, deadline)
        result.update(info)
    except BaseException as e:  # noqa: BLE001 - a fault here is ours or the dataset's, never a pass
        result = {"error": f"{type(e).__name__}: {e}"[:1000]}
    result["token"] = req.get("token")  # the trainer takes no report without it (a forged one has none)
    _write_all(report, marshal.dumps(result))


if __name__ == "__main__":
    if sys.argv[2:3] == ["candidate"]:
        candidate()
    else:
        checker()
