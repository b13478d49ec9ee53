"""Reference log-probs kept per row across runs, so a run that needs more rows computes only the ones not there.

Each row is named by a sha256 over the token columns the reference reads (and its images' content), so the same row in another dataset or
run is found again. A shard that does not load is moved aside with a warning and its rows are computed again."""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from pathlib import Path

log = logging.getLogger("tuneline")

SHARD_GLOB = "shard-*.npz"


def row_digests(dataset, columns: tuple[str, ...], rows: list[int] | None = None) -> list[bytes]:
    """sha256 of each row's token columns (all rows, or `rows` in that order), read from Arrow without Python lists."""
    import numpy as np

    view = dataset.select_columns(list(columns))
    if rows is not None:
        view = view.select(rows)
    digests: list[bytes] = []
    for table in view.with_format("arrow").iter(batch_size=1024):
        arrays = []
        for name in columns:
            column = table.column(name).combine_chunks()
            offsets = column.offsets.to_numpy()
            arrays.append((offsets - offsets[0], column.flatten().to_numpy().astype(np.int64)))
        for row in range(table.num_rows):
            digest = hashlib.sha256()
            for offsets, values in arrays:
                tokens = values[offsets[row]:offsets[row + 1]]
                digest.update(len(tokens).to_bytes(8, "little"))
                digest.update(tokens.tobytes())
            digests.append(digest.digest())
    return digests


def with_media(digests: list[bytes], dataset, rows: list[int], hash_file) -> list[bytes]:
    """The digests extended by the content of each row's images and videos (`hash_file(path)`), so a row whose
    tokens stay but whose image changed is computed again; unchanged for a split without media columns."""
    kinds = [kind for kind in ("images", "videos") if kind in dataset.column_names]
    if not kinds:
        return digests
    media = dataset.select(rows).select_columns(kinds).to_list()
    out = []
    for digest, row in zip(digests, media, strict=True):
        extended = hashlib.sha256(digest)
        for kind in kinds:
            for path in row[kind] or ():
                extended.update(f"{kind}:{hash_file(path)};".encode())
        out.append(extended.digest())
    return out


class RowStore:
    """The stored rows of one reference: `load()` them all, `add()` newly computed ones as one more shard."""

    def __init__(self, folder: str | Path, columns: tuple[str, ...]):
        self.folder, self.columns = Path(folder), tuple(columns)

    def load(self) -> dict[bytes, tuple[float, ...]]:
        import numpy as np

        rows: dict[bytes, tuple[float, ...]] = {}
        for shard in sorted(self.folder.glob(SHARD_GLOB)):
            try:
                with np.load(shard, allow_pickle=False) as data:
                    columns, digests, values = tuple(data["columns"].tolist()), data["digests"], data["values"]
                if columns != self.columns or len(digests) != len(values):
                    raise ValueError(f"holds columns {columns} for {len(digests)} rows, {len(values)} values")
            except Exception as exc:  # a damaged file of any kind: never trusted, rows recomputed
                aside = shard.with_name(f"{shard.name}.unreadable")
                os.replace(shard, aside)
                log.warning("reference row cache: %s does not load (%s); moved aside to %s, its rows are "
                            "computed again", shard, exc, aside.name)
                continue
            rows.update(zip((bytes(d) for d in digests), map(tuple, values.tolist()), strict=True))
        return rows

    def add(self, rows: dict[bytes, tuple[float, ...]]) -> Path | None:
        """Write `rows` as one shard, whole or not at all; returns its path (None when there is nothing to add)."""
        import numpy as np

        if not rows:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"shard-{time.time_ns()}-{uuid.uuid4().hex[:8]}.npz"
        tmp = self.folder / f".tmp-{name}"
        digests = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), 32)
        try:
            with open(tmp, "wb") as handle:
                np.savez(handle, columns=np.array(self.columns), digests=digests,
                         values=np.array(list(rows.values()), dtype=np.float64))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.folder / name)
        finally:
            tmp.unlink(missing_ok=True)
        return self.folder / name
