"""A replay of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, default settings).

`max_memory_allocated()` counts the blocks the allocator hands out, not the bytes asked for: sizes round
up to 512 B, and a block taken from a cached or fresh segment keeps its whole size when what would
remain is too small to split off. `max_memory_reserved()` counts the segments it holds. Both follow from
the sequence of allocations and frees alone on one stream, so replaying that sequence reproduces them.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ...errors import GpuestError

# Constants of CUDACachingAllocator.cpp (unchanged from torch 1.x through 2.11).
MIN_BLOCK_BYTES = 512              # kMinBlockSize: every size rounds up to a multiple of this
SMALL_SIZE_BYTES = 1 << 20         # kSmallSize: requests up to 1 MiB come from the small pool
SMALL_BUFFER_BYTES = 2 << 20       # kSmallBuffer: small-pool segments are 2 MiB
LARGE_BUFFER_BYTES = 20 << 20      # kLargeBuffer: requests of 1-10 MiB get a 20 MiB segment
MIN_LARGE_ALLOC_BYTES = 10 << 20   # kMinLargeAlloc: from 10 MiB a segment is the request rounded to 2 MiB
ROUND_LARGE_BYTES = 2 << 20        # kRoundLarge


class SimulatedOOM(GpuestError, MemoryError):
    """An allocation the simulated device cannot hold even after releasing every cached segment."""


def round_size(nbytes: int) -> int:
    """Bytes the allocator hands out for a request of `nbytes` before splitting (512-byte multiples)."""
    return MIN_BLOCK_BYTES * max(1, -(-int(nbytes) // MIN_BLOCK_BYTES))


def segment_size(nbytes: int) -> int:
    """Bytes of the segment (one cudaMalloc) a request of rounded size `nbytes` creates when none is cached."""
    if nbytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if nbytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return ROUND_LARGE_BYTES * -(-nbytes // ROUND_LARGE_BYTES)


@dataclass(eq=False)
class _Block:
    addr: int
    size: int
    small: bool
    allocated: bool = False
    prev: "_Block | None" = None
    next: "_Block | None" = None


@dataclass
class CachingAllocator:
    """Allocated and reserved bytes (current and peak) of a replayed allocation sequence.

    capacity_bytes: device memory cudaMalloc may hand out (None: unlimited). An allocation that does not
    fit first releases every fully free cached segment and retries, as the real allocator does, then
    raises SimulatedOOM."""

    capacity_bytes: float | None = None
    allocated_bytes: int = 0
    reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    _free: dict[bool, list[tuple[int, int]]] = field(default_factory=lambda: {True: [], False: []})
    _blocks: dict[int, _Block] = field(default_factory=dict)    # free blocks by address
    _live: dict[int, _Block] = field(default_factory=dict)      # allocated blocks by caller's id
    _next_addr: int = 0

    def malloc(self, key: int, nbytes: int) -> int:
        """Allocate `nbytes` for `key`; returns the block size counted as allocated (0 for 0 bytes)."""
        if nbytes <= 0:
            return 0
        size = round_size(nbytes)
        small = size <= SMALL_SIZE_BYTES
        block = self._take_free(size, small) or self._new_segment(size, small)
        remaining = block.size - size
        if remaining >= MIN_BLOCK_BYTES if small else remaining > SMALL_SIZE_BYTES:
            rest = _Block(block.addr + size, remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert_free(rest)
        block.allocated = True
        self._live[key] = block
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block.size

    def free(self, key: int) -> None:
        """Return `key`'s block to the cache, merged with free neighbours of its segment."""
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated_bytes -= block.size
        block.allocated = False
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                block = first
        self._insert_free(block)

    def reset_peak(self) -> None:
        """torch.cuda.reset_peak_memory_stats(): peaks restart from the current values."""
        self.peak_allocated_bytes, self.peak_reserved_bytes = self.allocated_bytes, self.reserved_bytes

    def release_cached(self) -> None:
        """torch.cuda.empty_cache(): give back every segment that holds no allocated block."""
        for small in (True, False):
            for size, addr in list(self._free[small]):
                block = self._blocks[addr]
                if block.prev is None and block.next is None:
                    self._remove_free(block)
                    self.reserved_bytes -= block.size

    # ------------------------------------------------------------------ internals
    def _take_free(self, size: int, small: bool) -> _Block | None:
        """Best fit: the smallest cached free block of the pool that holds `size` (lowest address on ties)."""
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i == len(pool):
            return None
        block = self._blocks.pop(pool.pop(i)[1])
        return block

    def _new_segment(self, size: int, small: bool) -> _Block:
        seg = segment_size(size)
        if self.capacity_bytes is not None and self.reserved_bytes + seg > self.capacity_bytes:
            self.release_cached()   # the allocator's last resort before reporting OOM
            if self.reserved_bytes + seg > self.capacity_bytes:
                raise SimulatedOOM(f"cannot allocate {seg} bytes: {self.allocated_bytes} allocated, "
                                   f"{self.reserved_bytes} reserved of {self.capacity_bytes:.0f}")
        block = _Block(self._next_addr, seg, small)
        self._next_addr += seg
        self.reserved_bytes += seg
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return block

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.addr))
        self._blocks[block.addr] = block

    def _remove_free(self, block: _Block) -> None:
        pool = self._free[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.addr))]
        del self._blocks[block.addr]


@dataclass
class ExactCounter:
    """Live bytes as asked for, with no rounding and no cache: what a fake-tensor memory tracker counts."""

    capacity_bytes: float | None = None
    allocated_bytes: int = 0
    peak_allocated_bytes: int = 0
    _live: dict[int, int] = field(default_factory=dict)

    @property
    def reserved_bytes(self) -> int:
        return self.allocated_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        return self.peak_allocated_bytes

    def malloc(self, key: int, nbytes: int) -> int:
        """Count `nbytes` for `key`; returns them."""
        self._live[key] = int(nbytes)
        self.allocated_bytes += int(nbytes)
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return int(nbytes)

    def free(self, key: int) -> None:
        self.allocated_bytes -= self._live.pop(key, 0)

    def reset_peak(self) -> None:
        self.peak_allocated_bytes = self.allocated_bytes
