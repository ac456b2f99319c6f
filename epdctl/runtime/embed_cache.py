"""LRU cache of image embeddings keyed by the image's content hash, bounded in megabytes.

Repeated images (a logo, the same screenshot in a conversation) skip the vision tower.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class EmbedCache:
    def __init__(self, capacity_mb: float):
        self.capacity_bytes = int(capacity_mb * 1024 * 1024)
        self._items: OrderedDict[str, tuple[torch.Tensor, tuple[int, int, int]]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    @staticmethod
    def _size(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def get(self, digest: str) -> tuple[torch.Tensor, tuple[int, int, int]] | None:
        item = self._items.get(digest)
        if item is not None:
            self._items.move_to_end(digest)
        return item

    def put(self, digest: str, embeds: torch.Tensor, grid: tuple[int, int, int]) -> None:
        """Insert (or refresh) an entry, evicting least recently used ones to stay within bounds."""
        size = self._size(embeds)
        if size > self.capacity_bytes:
            return  # would evict everything and still not fit
        old = self._items.pop(digest, None)
        if old is not None:
            self.bytes -= self._size(old[0])
        self._items[digest] = (embeds, grid)
        self.bytes += size
        while self.bytes > self.capacity_bytes:
            _, (evicted, _) = self._items.popitem(last=False)
            self.bytes -= self._size(evicted)
            self.evictions += 1

    def __contains__(self, digest: str) -> bool:
        return digest in self._items

    def __len__(self) -> int:
        return len(self._items)
