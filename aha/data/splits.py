"""Train and test by a hash of the text: the split every task and built-in environment shares."""

from __future__ import annotations

import hashlib


def split_of(key: str, test_percent: int = 10) -> str:
    """"test" for about `test_percent`% of keys, fixed by a hash of the text (not by a seed), so train and
    test never overlap whatever the seed. Example: split_of("3+4") is the same on every machine and run."""
    h = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
    return "test" if h % 100 < test_percent else "train"
