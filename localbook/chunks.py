"""How much pairwise work one step may hold: the memory budget, row chunks and tiles.

The one place the package chooses chunk sizes (:func:`chunk_rows`, :func:`tile_shape`), by the
device of the tensors: cache-sized on the CPU, larger on an accelerator. Imports only torch, so
that every module (input validation included) can chunk its work.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch

__all__ = ["chunk_rows", "iter_chunks", "tile_shape", "default_budget"]

#: Default memory budget (bytes) for one chunk of pairwise work on a GPU.
MEMORY_BUDGET = 256 * 2**20
#: On the CPU smaller chunks stay in cache: 16 MiB ran 4× faster than 256 MiB (n = 20,000).
CPU_MEMORY_BUDGET = 16 * 2**20
#: One tile of the fused kernel sum per CPU thread: L2-sized, so that the four passes over it
#: (distance product, clamp, exp, weighted sum) stay in cache (1 MiB tiles ran about 1.5× faster
#: than the 4 MiB chunks of the 16 MiB budget at n = m = 20,000).
CPU_TILE_BYTES = 2**20


def default_budget(device) -> int:
    """Bytes of temporaries per chunk: cache-sized on the CPU, larger on accelerators."""
    return CPU_MEMORY_BUDGET if torch.device(device).type == "cpu" else MEMORY_BUDGET


def chunk_rows(
    m: int,
    n: int,
    width: int = 1,
    itemsize: int = 8,
    budget: Optional[int] = None,
    device="cpu",
) -> int:
    """Rows per chunk so that about four ``(rows, n, width)`` temporaries fit in ``budget``.

    The one place the memory budget is chosen: ``budget=None`` picks it by ``device``
    (:func:`default_budget`: 16 MiB on the CPU, 256 MiB on an accelerator). Every chunked loop of
    the package calls this with its tensors' device.
    """
    budget = default_budget(device) if budget is None else budget
    per_row = max(1, 4 * n * width * itemsize)
    return max(1, min(m, budget // per_row))


def iter_chunks(m: int, rows: int) -> Iterator[slice]:
    for start in range(0, m, rows):
        yield slice(start, min(start + rows, m))


def tile_shape(
    m: int,
    n: int,
    itemsize: int = 8,
    budget: Optional[int] = None,
    device="cpu",
    depth: int = 4,
) -> Tuple[int, int]:
    """``(rows, cols)`` of one tile of the fused kernel sum (:func:`local_average`).

    The one place the tile is chosen. On the CPU with the default budget a tile holds
    :data:`CPU_TILE_BYTES` per torch thread. For a short distance product (``depth = d + 2 ≤
    16``: the passes over the tile dominate) whole data rows when at least 64 of them fit, else
    64 query rows × a block of the data (the sums then run over column blocks); for a long one
    (matrix products dominate) 256 query rows × a block, so each block of the data is read
    from memory once for many queries. Elsewhere, or with an explicit ``budget``, a tile is
    :func:`chunk_rows` whole rows.
    """
    if budget is None and torch.device(device).type == "cpu":
        elems = max(1, CPU_TILE_BYTES * max(1, torch.get_num_threads()) // itemsize)
        if depth > 16:
            rows = min(m, 256)
            return rows, max(1, min(n, elems // rows))
        if 64 * n <= elems:
            return max(1, min(m, elems // n)), n
        return min(m, 64), max(1, min(n, elems // 64))
    return chunk_rows(m, n, 1, itemsize, budget, device), n
