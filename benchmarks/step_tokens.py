"""Where step rewards land: the cost of mapping step ends (characters) to tokens, per completion.

    .venv/bin/python benchmarks/step_tokens.py [TOKENIZER_DIR]     # default: a tiny model's tokenizer built in code

aha.rewards.steps.step_tokens bisects on the decoded length of prefixes; the reference decodes every prefix once
(what it did before). Both on the same random token ids, 10 steps per completion; prints ms per completion and
whether the two agree.
"""

from __future__ import annotations

import bisect
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from aha.rewards.steps import PARTIAL, step_tokens  # noqa: E402


def every_prefix(tok, ids: list[int], ends: list[int]) -> list[int]:
    """The reference: the decoded length after every token, then a search."""
    lengths, top = [], 0
    for p in tok.batch_decode([ids[:i + 1] for i in range(len(ids))], skip_special_tokens=True):
        top = max(top, len(p) - p.endswith(PARTIAL))
        lengths.append(top)
    return [min(bisect.bisect_left(lengths, e), len(ids) - 1) for e in ends]


def main() -> None:
    from aha.models import load_tokenizer
    if len(sys.argv) > 1:
        tok = load_tokenizer(sys.argv[1])
    else:
        from aha.models.tiny import make_tiny
        from aha.tasks import get_task, task_corpus
        rows = get_task("arithmetic").load("train", 500)
        tok = load_tokenizer(str(make_tiny(Path(tempfile.mkdtemp()) / "m", task_corpus(rows), size="tiny")))
    rng = random.Random(0)
    for T in (48, 512, 1024):
        ids = [rng.randrange(5, tok.vocab_size) for _ in range(T)]
        ends = [len(tok.decode(ids, skip_special_tokens=True)) * k // 10 for k in range(1, 11)]
        timings = {}
        for name, fn in (("bisection", step_tokens), ("every prefix", every_prefix)):
            t0 = time.perf_counter()
            got = fn(tok, ids, ends)
            timings[name] = (1000 * (time.perf_counter() - t0), got)
        agree = timings["bisection"][1] == timings["every prefix"][1]
        print(f"{T:5d} tokens: bisection {timings['bisection'][0]:.2f} ms, every prefix "
              f"{timings['every prefix'][0]:.2f} ms, same tokens: {agree}")


if __name__ == "__main__":
    main()
