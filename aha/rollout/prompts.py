"""What the experience box draws from: the training rows (a list read at once, or a stream read as asked), each
checked and encoded, and the seeded order they come in."""

from __future__ import annotations

from typing import Callable

from ..data import check_row, has_columns, is_stream, load_rows
from ..data.sampler import BalancedSampler, PromptSampler, StreamSampler, balance_labels
from ..rewards import check_columns, check_not_all_null
from ..rewards.scoring import needed_columns


class PromptSource:
    """Rows and their prompt token ids, drawn B at a time. A stream's rows are kept only until drawn.

    Every row has each column the reward functions read (a row without one would only be counted in
    `reward/data_errors`): a list's rows are checked now, a stream's first row now and each later one as it is
    read. Rows are read before the model loads (a data error is told at once); `encode_with` then gives each its
    prompt ids."""

    def __init__(self, dataset, prompt_column: str | None, seed: int, shuffle: bool, reward_funcs: list[Callable],
                 balance_by: str | None = None):
        self.streaming, self.prompt_column = is_stream(dataset), prompt_column
        self.required = tuple(dict.fromkeys(c for f in reward_funcs for c in needed_columns(f)))
        self.encode: Callable[[int, dict], list[int] | None] = lambda i, row: None
        self.rows: dict[int, dict] | list[dict]
        self.prompt_ids: dict[int, list[int] | None] | list[list[int] | None]
        if not self.streaming:
            rows = load_rows(dataset, prompt_column)
            check_columns(reward_funcs, {k: None for k in rows[0]})
            self.rows = [has_columns(r, i, self.required) for i, r in enumerate(rows)]
            check_not_all_null(reward_funcs, self.rows)
            self.prompt_ids = [None] * len(self.rows)
            self.sampler = (BalancedSampler(balance_labels(self.rows, balance_by), seed, shuffle=shuffle,
                                            column=balance_by) if balance_by else
                            PromptSampler(len(self.rows), seed, shuffle=shuffle))
            return
        if balance_by:
            raise ValueError(f"balance_by={balance_by!r} needs a dataset of known rows: a streaming dataset's values "
                             "are not known before they are read")
        if iter(dataset) is dataset:
            raise ValueError(f"train_dataset is a {type(dataset).__name__}, which can be read only once, and "
                             "training reads its rows again every epoch: pass a list, a datasets.Dataset, or "
                             "datasets.IterableDataset.from_generator(a function that makes the generator)")
        first = check_row(next(iter(dataset), None) or {}, 0, prompt_column)
        check_columns(reward_funcs, {k: None for k in first})
        self.rows, self.prompt_ids = {}, {}
        self.sampler = StreamSampler(dataset, seed, self._admit, shuffle=shuffle)

    def encode_with(self, encode: Callable[[int, dict], list[int]]) -> None:
        """Encode every row with `encode(i, row)` (a stream's as each is read). Not called for an agent's rows, whose
        prompts are encoded per episode (after its environment's reset)."""
        self.encode = encode
        if not self.streaming:
            self.prompt_ids = [encode(i, r) for i, r in enumerate(self.rows)]

    def __len__(self) -> int:
        """Rows in the dataset (a stream has no length: an error)."""
        if self.streaming:
            raise ValueError("a streaming dataset has no length; set max_steps")
        return len(self.rows)

    def _admit(self, i: int, row) -> None:
        """A row read from a stream: checked (the required columns too), encoded, kept until it is drawn."""
        self.rows[i] = check_row(row, i, self.prompt_column, self.required)
        self.prompt_ids[i] = self.encode(i, self.rows[i])

    def take(self, k: int) -> tuple[list[dict], list[list[int] | None]]:
        """The next k rows and their prompt ids, in the sampler's order (a stream's are dropped here)."""
        idx = self.sampler.take(k)
        if not self.streaming:
            return [self.rows[i] for i in idx], [self.prompt_ids[i] for i in idx]
        return [self.rows.pop(i) for i in idx], [self.prompt_ids.pop(i) for i in idx]

    def epoch(self, step: int, prompts_per_step: int) -> float | None:
        """Passes over the rows after `step` steps of `prompts_per_step` (None for a stream)."""
        return None if self.streaming else step * prompts_per_step / len(self.rows)
