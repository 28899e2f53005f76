"""The order training draws dataset rows in: seeded permutations of a list (`PromptSampler`), or a streaming
dataset read through its shuffle buffer (`StreamSampler`). A position is a few integers, saved in checkpoints."""

from __future__ import annotations

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
