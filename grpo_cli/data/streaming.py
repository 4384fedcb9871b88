"""data.streaming: rows read lazily from a datasets IterableDataset, shuffled in blocks, resumable exactly.

`sources.load_rows` opens data.files (JSON Lines / JSON / Parquet / CSV shards) or data.dataset (a hub dataset, a
folder of data files, a `save_to_disk` folder) as an IterableDataset: nothing is loaded or written to the datasets
cache. `StreamedRows` hands its rows out epoch after epoch:

- epoch e reads the shards (one per file) in the order of a permutation seeded with (seed, e), in blocks of
  data.shuffle_buffer rows; a block ends early at the end of the epoch. Without data.shuffle, or with data.limit
  (the first N rows in file order, as for in-memory data), the shards are read in their own order;
- block b of epoch e is handed out in the order of a permutation seeded with (seed, e, b) (as read without
  data.shuffle);
- a row's index is its position in the stream since the run began: 0, 1, 2, ... (rollouts.jsonl's data_index).

The state is where the recent blocks start (epoch, block number, shard position in the epoch's order, row within
that shard, rows the epoch read before it, index of its first row) and how many rows of the last one were handed
out. A resume re-reads one block (datasets skips to a row of a shard without decoding the rows before it) and goes
on exactly as the run would have; the batches in flight at a checkpoint (rollout.max_staleness) are re-read from
their blocks the same way. Blocks rather than datasets' sliding shuffle buffer, whose rows a checkpoint would have
to hold for the resume to be exact.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any, Iterator

from grpo_cli.errors import DataError, first_line

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset

    from grpo_cli.recipe.schema import DataConfig

CACHED_BLOCKS = 4  # blocks whose rows stay in memory: the current one and those of the batches in flight


def stream_columns(dataset: IterableDataset, source: str) -> list[str]:
    """The columns of a stream: its features, else its first row's; DataError when it holds no rows."""
    try:
        first = next(iter(dataset.take(1)), None)
    except Exception as e:  # noqa: BLE001 - whatever the reader raises, said in one line
        raise DataError(f"{source} could not be read: {type(e).__name__}: {first_line(e)}") from e
    if first is None:
        raise DataError(f"{source} has no rows; check the split or the files")
    return list(dataset.features or first)


def head_rows(dataset: IterableDataset, n: int | None) -> Dataset:
    """The first n rows of a stream (all with None) as an in-memory Dataset (an eval's problems)."""
    from datasets import Dataset

    return Dataset.from_list(list(islice(dataset, n)), features=dataset.features)


@dataclass
class Block:
    """The rows of epoch `epoch` read from position `shard` of the epoch's shard order, row `row` of that shard on;
    `read`: rows the epoch read before it; `first`: the index of its first row handed out."""

    epoch: int
    number: int
    shard: int
    row: int
    read: int
    first: int


class StreamedRows:
    """A stream's rows, epoch after epoch, shuffled in blocks (the module's docstring); `keep`: rows handed out
    that `columns` must still give back (the batches a checkpoint may hold in flight)."""

    def __init__(self, dataset: IterableDataset, cfg: DataConfig, seed: int, keep: int) -> None:
        self.dataset, self.cfg, self.seed, self.keep = dataset, cfg, seed, keep
        self.shards = dataset.num_shards
        self.files = self._fingerprints()  # the local files read, so a resume can tell they are the same
        self.blocks = [Block(epoch=0, number=0, shard=0, row=0, read=0, first=0)]  # the last is the current one
        self.taken = 0  # rows of the current block handed out
        self._cache: OrderedDict[tuple[int, int], tuple[list[dict], tuple[int, int]]] = OrderedDict()
        self._live: tuple[int, int, Iterator[dict]] | None = None  # (shard, row, iterator) the next read continues

    @property
    def epoch(self) -> int:
        return self.blocks[-1].epoch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "taken": self.taken, "shards": self.shards, "blocks": [asdict(b) for b in self.blocks],
                **({"files": self.files} if self.files is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            blocks, taken = [Block(**b) for b in state["blocks"]], int(state["taken"])
        except (KeyError, TypeError):
            raise ValueError(f"the data position {state} was not saved by a streamed run (data.streaming)") from None
        if not blocks or taken < 0:
            raise ValueError(f"the data position {state} holds no block")
        if state.get("shards", self.shards) != self.shards:  # e.g. a glob in data.files matching more files now
            raise ValueError(f"the data had {state['shards']} shards at the checkpoint, {self.shards} now")
        saved = state.get("files")
        if saved is not None and self.files is not None and saved != self.files:  # as many shards, other contents
            was, now = next((a, b) for a, b in zip(saved + [""] * len(self.files), self.files + [""] * len(saved))
                            if a != b)
            raise ValueError(f"the data files changed since the checkpoint: {was or '(none)'} then, "
                             f"{now or '(none)'} now (name, bytes, sha256 of their ends)")
        self.blocks, self.taken = blocks, taken  # the cache and the open reader stay valid: a block's rows are fixed
        rows, _ = self._block(blocks[-1])
        if taken > len(rows):
            raise ValueError(f"block {blocks[-1].number} of epoch {blocks[-1].epoch} now holds {len(rows)} rows, "
                             f"the checkpoint had handed out {taken} of them")

    # ---------------------------------------------------------------- handing out

    def take(self, n: int) -> list[int]:
        """The indices of the next n rows; the stream moves past them."""
        out: list[int] = []
        while len(out) < n:
            block = self.blocks[-1]
            size = len(self._block(block)[0])
            if self.taken == size:
                self._next_block()
                continue
            k = min(n - len(out), size - self.taken)
            out += range(block.first + self.taken, block.first + self.taken + k)
            self.taken += k
        start = self.blocks[-1].first + self.taken - self.keep
        while len(self.blocks) > 1 and self.blocks[1].first <= start:  # every row of the oldest block is older
            self.blocks.pop(0)
        return out

    def _next_block(self) -> None:
        b = self.blocks[-1]
        rows, (shard, row) = self._block(b)
        after = Block(b.epoch, b.number + 1, shard, row, b.read + len(rows), b.first + len(rows))
        if not self._block(after)[0]:  # the epoch has ended
            after = Block(b.epoch + 1, 0, 0, 0, 0, after.first)
            if not self._block(after)[0]:
                raise DataError(f"{self._source()} holds no rows any more (epoch {after.epoch} read none)")
        self.blocks.append(after)
        self.taken = 0

    def columns(self, indices: list[int]) -> dict[str, list]:
        """The rows `indices` (handed out, and among the last `keep`) as column -> values."""
        rows = [self._row(i) for i in indices]
        names = list(self.dataset.features or (rows[0] if rows else {}))
        return {k: [r.get(k) for r in rows] for k in names}

    def _row(self, index: int) -> dict:
        for b in reversed(self.blocks):
            if b.first <= index:
                rows = self._block(b)[0]
                if index - b.first < len(rows):
                    return rows[index - b.first]
                break
        raise ValueError(f"row {index} of the data stream is not among the rows it remembers "
                         f"({self.blocks[0].first} to {self.blocks[-1].first + self.taken - 1})")

    # ---------------------------------------------------------------- reading

    def shard_order(self, epoch: int) -> list[int]:
        """The shards in the order epoch `epoch` reads them."""
        import numpy as np

        if not self.cfg.shuffle or self.cfg.limit is not None:
            return list(range(self.shards))
        return np.random.default_rng([self.seed % 2**63, epoch]).permutation(self.shards).tolist()

    def _block(self, b: Block) -> tuple[list[dict], tuple[int, int]]:
        """Block b's rows in the order they are handed out, and where it ended (shard position, row)."""
        import numpy as np

        key = (b.epoch, b.number)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        rows, end = self._read(b)
        if self.cfg.shuffle:
            order = np.random.default_rng([self.seed % 2**63, b.epoch, b.number]).permutation(len(rows))
            rows = [rows[i] for i in order]
        self._cache[key] = (rows, end)
        while len(self._cache) > CACHED_BLOCKS:
            self._cache.popitem(last=False)
        return rows, end

    def _read(self, b: Block) -> tuple[list[dict], tuple[int, int]]:
        order = self.shard_order(b.epoch)
        want = self.cfg.shuffle_buffer if self.cfg.limit is None else min(self.cfg.shuffle_buffer, self.cfg.limit - b.read)
        shard, row, rows = b.shard, b.row, []
        while len(rows) < want and shard < len(order):
            it = self._open(order[shard], row)
            try:
                for example in it:
                    rows.append(example)
                    row += 1
                    if len(rows) == want:
                        break
                else:  # the shard has ended
                    self._live = None
                    shard, row = shard + 1, 0
                    continue
            except Exception as e:  # noqa: BLE001 - a bad row deep in a file: say where
                self._live = None
                raise DataError(f"{self._source(order[shard])}: reading on from row {row + 1} failed (a chunk of rows is "
                                f"parsed at a time): {type(e).__name__}: {first_line(e)}") from e
            self._live = (order[shard], row, it)
        return rows, (shard, row)

    def _open(self, shard: int, row: int) -> Iterator[dict]:
        """An iterator over shard `shard` from its row `row` (the live one when it stands there)."""
        if self._live is not None and self._live[:2] == (shard, row):
            return self._live[2]
        self.close()
        part = self.dataset.shard(num_shards=self.shards, index=shard, contiguous=True)
        return iter(part.skip(row) if row else part)

    def _fingerprints(self) -> list[str] | None:
        """paths.file_fingerprints of data.files, or of a data.dataset that is a local folder; None for the hub."""
        from pathlib import Path

        from grpo_cli.data.paths import expand_files, file_fingerprints

        if self.cfg.files:
            return file_fingerprints(expand_files(self.cfg.files, "data.files"))
        if self.cfg.dataset and Path(self.cfg.dataset).expanduser().is_dir():
            return file_fingerprints([self.cfg.dataset])
        return None

    def _source(self, shard: int | None = None) -> str:
        from grpo_cli.data.paths import expand_files

        files = expand_files(self.cfg.files, "data.files") if self.cfg.files else []
        if shard is not None and len(files) == self.shards:  # one shard per file: the file
            return f"data.files: {files[shard]}"
        what = f"data.files {files}" if files else f"data.dataset {self.cfg.dataset!r}"
        return what if shard is None else f"{what}, shard {shard} of {self.shards}"

    def close(self) -> None:
        """Close the open reader (a generator left open warns when the interpreter ends)."""
        if self._live is not None:
            close = getattr(self._live[2], "close", None)
            self._live = None
            if close is not None:
                close()
