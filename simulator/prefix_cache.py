"""An LRU of KV blocks keyed by chained prefix hashes: vLLM's automatic prefix caching.

A prompt whose leading blocks were computed recently skips their prefill. That saving is
what the gateway's prefix-affinity routing buys, so the simulator must reproduce it for the
benefit to be measurable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self, capacity_blocks: int) -> None:
        self._capacity = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks are cached; touches them so they stay warm."""
        hits = 0
        for h in block_hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hits += 1
        return hits

    def insert(self, block_hashes: Sequence[int]) -> None:
        for h in block_hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
