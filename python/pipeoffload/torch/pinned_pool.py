"""Reusable pinned host buffers for offloaded tensors; no torch in it (the allocator and the
events are injected), so the reuse rule is tested anywhere.

Invariants:
  - A buffer is FREE (in the pool) or HELD (by one stash entry, from its OFFLOAD until its B).
  - A buffer given back carries a fence: the event of the last copy that read it (the reload's
    H2D). It is handed out again only after fence.query() is true, or after fence.synchronize()
    when no other free buffer of its size is ready; a D2H copy therefore never overwrites bytes
    an earlier H2D copy has yet to read. (A buffer given back without a fence is ready at once.)
  - Buffers are matched by exact byte size, so the number allocated per size is the peak number
    held at once, which ledger.replay() predicts (host_buffers_peak).
"""
import collections
import dataclasses
from typing import Any, Callable, Dict, List, Tuple


@dataclasses.dataclass
class PoolStats:
    allocated: Dict[int, int] = dataclasses.field(default_factory=collections.Counter)
    reused: int = 0          # acquisitions served by a buffer given back earlier
    waited: int = 0          # reuses that had to synchronize on the buffer's fence first
    held: int = 0            # buffers out of the pool now

    @property
    def allocated_bytes(self) -> int:
        return sum(size * count for size, count in self.allocated.items())


class PinnedPool:
    """allocate(nbytes) makes a new pinned buffer (torch: a uint8 tensor with
    pin_memory=True). Not thread-safe: one issuing thread owns it."""

    def __init__(self, allocate: Callable[[int], Any]):
        self._allocate = allocate
        self._free: Dict[int, List[Tuple[Any, Any]]] = collections.defaultdict(list)
        self.stats = PoolStats()

    def acquire(self, nbytes: int):
        """A buffer of exactly `nbytes` bytes whose last reader has finished."""
        if nbytes < 0:
            raise ValueError(f"PinnedPool.acquire: negative size {nbytes}")
        free = self._free[nbytes]
        self.stats.held += 1
        for i, (buffer, fence) in enumerate(free):
            if fence is None or fence.query():
                del free[i]
                self.stats.reused += 1
                return buffer
        if free:
            # Every free buffer of this size still has a copy reading it: waiting for the oldest
            # (issued first, so done first) keeps the pool at its predicted size.
            buffer, fence = free.pop(0)
            fence.synchronize()
            self.stats.reused += 1
            self.stats.waited += 1
            return buffer
        self.stats.allocated[nbytes] += 1
        return self._allocate(nbytes)

    def give_back(self, buffer, nbytes: int, fence=None):
        """Returns `buffer` (of `nbytes` bytes); `fence` is the event of the last copy reading
        it (None when none is pending)."""
        self.stats.held -= 1
        self._free[nbytes].append((buffer, fence))

    def free_buffers(self) -> int:
        return sum(len(v) for v in self._free.values())


def dense_span(size, stride) -> int:
    """Elements a tensor of this size and stride covers when it is non-overlapping and dense
    (every element in [0, span) used once: a permutation of a contiguous layout), else -1.
    Such a tensor can be copied as its storage span and rebuilt with the same strides (so the
    backward's kernels see the same layout and give the same bits)."""
    if len(size) != len(stride):
        raise ValueError(f"dense_span: {len(size)} sizes but {len(stride)} strides")
    if any(n == 0 for n in size):
        return 0
    dims = sorted((s, n) for n, s in zip(size, stride) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            return -1
        expected *= n
    return expected
