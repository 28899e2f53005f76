"""Symbolic-equivalence workers for aha.rewards.maths, run as a script by WorkerPool (argv: memory cap in MiB,
the trainer's pid).

This process is the zygote: it imports and warms math-verify, then for each request on its control socket
(stdin) forks a worker that serves {"pred", "gold"} JSON lines on the socket it was handed, answering
{"gold_ok": bool, "equal": bool}. Workers have no time limit of their own: the pool kills one that overruns,
which also covers sympy stuck in C code where signals never fire.
"""
import ctypes
import gc
import json
import logging
import os
import re
import resource
import signal
import socket
import sys

MIXED_NUMBER = re.compile(r"(?<![\w.,/^])(\d+) +(\d+)/(\d+)(?![\w.,/^])")  # "1 1/2", which math-verify reads as 1


def _die_with_parent(parent: int) -> None:
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def serve(sock: socket.socket, judge, memory_mb: int) -> None:
    if memory_mb > 0:
        cap = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    reader, writer = sock.makefile("rb"), sock.makefile("wb")

    def reply(obj: dict) -> None:
        writer.write((json.dumps(obj) + "\n").encode())
        writer.flush()

    writer.write(b"ready\n")
    writer.flush()
    for line in reader:
        task = json.loads(line)
        try:
            answer = judge(task["pred"], task["gold"])
        except MemoryError:
            reply({"gold_ok": True, "equal": False, "limit": "memory"})
            os._exit(3)  # a fresh fork is cheaper than a fragmented heap
        except Exception:  # noqa: BLE001 - sympy raises anything; a verdict we cannot reach is "not equal"
            answer = {"gold_ok": True, "equal": False}
        reply(answer)
    os._exit(0)


def main() -> None:
    memory_mb, parent = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent(parent)
    ctl = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # stray prints from libraries go nowhere
        os.dup2(null, fd)
    logging.disable(logging.WARNING)  # math-verify warns that its own (signal) timeouts are off
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from sympy import Basic, MatrixBase

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def parsed(answer: str) -> list:
        # The whole answer as one LaTeX expression: math-verify must not pick a number out of a sentence. A mixed
        # number is written as LaTeX's 1\frac{1}{2}, which it reads as 3/2.
        answer = MIXED_NUMBER.sub(r"\1\\frac{\2}{\3}", answer)
        return parse(f"${answer}$", extraction_config=config, parsing_timeout=None)

    def judge(pred: str, gold: str) -> dict:
        g = parsed(gold)
        if not any(isinstance(x, (Basic, MatrixBase)) for x in g):
            return {"gold_ok": False, "equal": False}
        p = parsed(pred)
        return {"gold_ok": True, "equal": bool(p) and bool(verify(g, p, timeout_seconds=None))}

    for pred, gold in (("1", "\\frac{1}{1}"), ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"), ("(1, 2]", "(1,2]"),
                       ("x^2+2x+1", "(x+1)^2"), ("\\{1, 2\\}", "\\{2, 1\\}"), ("x = 5", "5")):
        judge(pred, gold)  # sympy imports much of itself lazily: pay that once, here, for every worker
    gc.freeze()  # the warmed heap stays shared with the workers: their collector never walks it
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # dead workers are reaped by the kernel
    ctl.sendall(b"ready\n")
    me = os.getpid()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 16, 1)
        except OSError:
            break
        if not msg or not fds:
            break
        pid = os.fork()
        if pid == 0:
            ctl.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _die_with_parent(me)
            serve(socket.socket(fileno=fds[0]), judge, memory_mb)
        os.close(fds[0])
        ctl.sendall(f"{pid}\n".encode())
    sys.exit(0)


if __name__ == "__main__":
    main()
