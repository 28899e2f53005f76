"""The order training draws dataset rows in: seeded permutations of a list (`PromptSampler`), round-robin over a
column's values (`BalancedSampler`), or a streaming dataset read through its shuffle buffer (`StreamSampler`). A
position is a few integers, saved in checkpoints."""

from __future__ import annotations

import hashlib

import torch

class PromptSampler:
    """Walks seeded per-epoch permutations of the dataset (or its order, with shuffle=False); its position
    is two integers."""

    def __init__(self, n: int, seed: int, epoch: int = 0, index: int = 0, shuffle: bool = True):
        self.n, self.seed, self.epoch, self.index, self.shuffle = n, seed, epoch, index, shuffle
        self._perm = self._permutation()

    def _permutation(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.index == self.n:
                self.epoch, self.index = self.epoch + 1, 0
                self._perm = self._permutation()
            out.append(self._perm[self.index])
            self.index += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "n": self.n}

    def restored(self, state: dict) -> "PromptSampler":
        """The sampler at a checkpoint's position. A dataset of another size than the checkpoint's is refused here,
        at resume, not steps later: its permutations differ, and a position past its end cannot be taken from.
        (A checkpoint written before `n` was kept is checked on its position only.)"""
        epoch, index, n = state.get("epoch"), state.get("index"), state.get("n", self.n)
        if not all(isinstance(v, int) and v >= 0 for v in (epoch, index, n)):
            raise ValueError(f"the checkpoint's sampler state {state!r} is not (epoch, index, n) counts")
        if n != self.n:
            raise ValueError(f"the checkpoint was written with a dataset of {n} rows and this one has {self.n}: the "
                             "dataset changed since the checkpoint, so resuming would not draw the rows it would "
                             "have; restore that dataset, or start a new run (another output_dir, or resume=false)")
        if index > self.n:
            raise ValueError(f"the checkpoint's sampler position (epoch {epoch}, row {index}) is past this dataset's "
                             f"{self.n} rows: the dataset changed since the checkpoint (was it shrunk?)")
        return PromptSampler(self.n, self.seed, epoch, index, shuffle=self.shuffle)


class BalancedSampler:
    """Draws round-robin over the values of one column (GRPOConfig.balance_by): draw i is of value i % V (the V
    values in sorted order), and each value's rows come in seeded permutations of their own, a new one each time
    they are used up. Every value is drawn equally often, whatever its share of the rows: a rare value's rows
    repeat sooner. Its position is one integer, the draws so far."""

    def __init__(self, labels: list, seed: int, index: int = 0, shuffle: bool = True, column: str = "label"):
        self.labels, self.seed, self.index, self.shuffle, self.column = labels, seed, index, shuffle, column
        self.n = len(labels)
        self.values = sorted(set(labels), key=lambda v: (type(v).__name__, v))
        self.rows = {v: [i for i, x in enumerate(labels) if x == v] for v in self.values}
        self._perms: dict[int, tuple[int, list[int]]] = {}  # value -> (its epoch, that epoch's permutation)
        self.labels_sha256 = hashlib.sha256(repr(list(labels)).encode()).hexdigest()
        """Which row has which value, as a digest a checkpoint keeps: a relabelled dataset is refused at resume."""

    def _row(self, i: int) -> int:
        """The row of draw i."""
        v, k = i % len(self.values), i // len(self.values)  # value, and its draws before this one
        rows = self.rows[self.values[v]]
        epoch, j = divmod(k, len(rows))
        if not self.shuffle:
            return rows[j]
        if self._perms.get(v, (None,))[0] != epoch:
            seeded = torch.Generator().manual_seed(self.seed + 1_000_003 * v + epoch)
            self._perms[v] = (epoch, torch.randperm(len(rows), generator=seeded).tolist())
        return rows[self._perms[v][1][j]]

    def take(self, k: int) -> list[int]:
        out = [self._row(i) for i in range(self.index, self.index + k)]
        self.index += k
        return out

    def state(self) -> dict:
        return {"index": self.index, "n": self.n, "balance_by": self.column, "values": len(self.values),
                "labels_sha256": self.labels_sha256}

    def restored(self, state: dict) -> "BalancedSampler":
        """The sampler at a checkpoint's position; a checkpoint of another draw order, or of a dataset with other
        rows or other values in the column (any row's, by the digest; a checkpoint without one: by the counts), is
        refused here, at resume."""
        index = state.get("index")
        if state.get("balance_by") != self.column or not isinstance(index, int) or index < 0:
            raise ValueError(f"the checkpoint's sampler state {state!r} is not a balanced draw over column "
                             f"{self.column!r}: was balance_by changed since the checkpoint?")
        if (state.get("n"), state.get("values"), state.get("labels_sha256", self.labels_sha256)) != (
                self.n, len(self.values), self.labels_sha256):
            raise ValueError(f"the checkpoint was written with {state.get('n')} rows and {state.get('values')} values "
                             f"of {self.column!r}; this dataset has {self.n} and {len(self.values)}, or its rows "
                             "have other values: the dataset changed since the checkpoint; restore it, or start a "
                             "new run")
        return BalancedSampler(self.labels, self.seed, index, self.shuffle, self.column)


def balance_labels(rows: list[dict], column: str) -> list:
    """Each row's value of `column`, the labels a BalancedSampler draws over; a row without it, or with a value that
    cannot label (not hashable, or NaN: equal to no value, itself included), is an error naming the row."""
    labels = []
    for i, row in enumerate(rows):
        if column not in row:
            raise ValueError(f"balance_by={column!r}: dataset row {i} has no column {column!r} (columns: "
                             f"{sorted(row)})")
        try:
            hash(row[column])
        except TypeError:
            raise ValueError(f"balance_by={column!r}: dataset row {i}'s value {row[column]!r:.60} cannot label a "
                             "group of rows (a string or number can)") from None
        if row[column] != row[column]:
            raise ValueError(f"balance_by={column!r}: dataset row {i}'s value is NaN, which equals no value (itself "
                             "included), so it cannot label a group of rows; fill it in or drop the row")
        labels.append(row[column])
    return labels


_END = object()  # what next() gives at the end of a stream
SHUFFLE_BUFFER = 1000
"""Rows a streaming dataset shuffles among (datasets.IterableDataset.shuffle's buffer_size)."""


class StreamSampler:
    """Rows of a streaming dataset in a seeded shuffled order (datasets' shuffle buffer, reseeded every epoch),
    read as training asks for them: nothing is loaded up front, so an endless stream works. Each row goes to
    `admit(index, row)`; `take` returns the indices. Its position is (epoch, rows read in this epoch)."""

    def __init__(self, dataset, seed: int, admit, epoch: int = 0, index: int = 0, shuffle: bool = True):
        self.dataset, self.seed, self.admit, self.epoch, self.index = dataset, seed, admit, epoch, index
        self.shuffle = shuffle
        self.n = 0  # rows handed out so far: their indices
        self._rows = self._open(skip=index)

    def _open(self, skip: int = 0):
        stream = self.dataset
        if self.shuffle and hasattr(stream, "shuffle"):
            stream = stream.shuffle(seed=self.seed + self.epoch, buffer_size=SHUFFLE_BUFFER)
        rows = iter(stream)
        for read in range(skip):  # resuming: the same order, so skipping re-reads what was trained on
            if next(rows, _END) is _END:
                raise ValueError(f"the checkpoint's stream position (epoch {self.epoch}, row {skip}) is past the end "
                                 f"of this streaming dataset, which has {read} rows: the dataset changed since the "
                                 "checkpoint (was it shrunk?)")
        return rows

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            try:
                row = next(self._rows)
            except StopIteration:
                if self.index == 0:
                    raise ValueError("the streaming dataset is empty") from None
                self.epoch, self.index = self.epoch + 1, 0
                self._rows = self._open()
                continue
            self.admit(self.n, row)
            out.append(self.n)
            self.n, self.index = self.n + 1, self.index + 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def restored(self, state: dict) -> "StreamSampler":
        return StreamSampler(self.dataset, self.seed, self.admit, shuffle=self.shuffle, **state)
