"""Persistent per-sequence KV for batched decode: one slot per running sequence.

Per layer, keys and values live in one [slots, kv_heads, capacity, head_dim] tensor. A sequence
owns a slot from ``add`` to ``free``: its prompt's KV is copied in once, each step appends one
column in place, and the running sequences always fill slots 0..n-1 (a freed slot takes the
last sequence, one copy), so a step's batch is a view of the first n slots, never a rebuild.
Both dimensions grow by doubling when a sequence needs more room (rare, amortised).

``SlotCache`` is what the model's attention layers see (transformers' ``Cache.update`` call):
it writes each row's new K/V at that row's own length and returns the batch's view, which the
attention reads under a mask that hides every column past a row's length (``additive_mask``).
"""

from __future__ import annotations

import torch

_COL = 64  # capacity grows in whole multiples of this many tokens


class KVSlots:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, slots: int = 4,
                 capacity: int = 256):
        self.shape = (kv_heads, head_dim)
        self.dtype = dtype
        self.keys = [torch.zeros(slots, kv_heads, capacity, head_dim, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(slots, kv_heads, capacity, head_dim, dtype=dtype) for _ in range(layers)]
        self.lengths: list[int] = []      # per used slot: tokens held
        self.owner: list[str] = []        # per used slot: sequence id

    @property
    def used(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def _grow(self, slots: int, capacity: int) -> None:
        old_slots, old_cap = self.keys[0].shape[0], self.capacity
        if slots <= old_slots and capacity <= old_cap:
            return
        slots, capacity = max(slots, old_slots), max(capacity, old_cap)
        for table in (self.keys, self.values):
            for i, old in enumerate(table):
                new = torch.zeros(slots, *self.shape[:1], capacity, self.shape[1], dtype=self.dtype)
                new[:old_slots, :, :old_cap] = old
                table[i] = new

    def reserve(self, count: int, need: int) -> None:
        """Room for ``count`` used slots of ``need`` tokens each: one reallocation for a step's joiners
        rather than one per joiner."""
        slots = self.keys[0].shape[0]
        while slots < count:
            slots *= 2
        self._grow(slots, max(self.capacity * 2, -(-need // _COL) * _COL) if need > self.capacity else self.capacity)

    def add(self, seq_id: str, kv: list[tuple[torch.Tensor, torch.Tensor]], room: int) -> int:
        """Copy a prompt's KV ([1, heads, n, dim] per layer) into a new slot with ``room`` more tokens."""
        n = int(kv[0][0].shape[2])
        self.reserve(self.used + 1, n + max(room, 1))
        slot = self.used
        for layer, (k, v) in enumerate(kv):
            self.keys[layer][slot, :, :n] = k[0]
            self.values[layer][slot, :, :n] = v[0]
        self.lengths.append(n)
        self.owner.append(seq_id)
        return slot

    def free(self, slot: int) -> str | None:
        """Release ``slot``; the last used slot moves into it. Returns the moved sequence's id (or None)."""
        last = self.used - 1
        moved = None
        if slot != last:
            n = self.lengths[last]
            for table in (self.keys, self.values):
                for t in table:
                    t[slot, :, :n] = t[last, :, :n]
            self.lengths[slot], self.owner[slot] = n, self.owner[last]
            moved = self.owner[slot]
        self.lengths.pop()
        self.owner.pop()
        return moved

    def prompt_kv(self, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The KV a slot holds (views), per layer [heads, length, dim]; for tests and checks."""
        n = self.lengths[slot]
        return [(k[slot, :, :n], v[slot, :, :n]) for k, v in zip(self.keys, self.values)]


class SlotCache:
    """The one-step cache transformers' attention layers write to and read from."""

    is_compileable = False

    def __init__(self, slots: KVSlots, n: int):
        """The batch of slots 0..n-1."""
        self.slots = slots
        self.n = n
        self.cols = torch.tensor(slots.lengths[:n], dtype=torch.long)
        self.width = max(slots.lengths[:n]) + 1
        _, heads, capacity, dim = slots.keys[0].shape
        # row i, head h writes table row (i * heads + h) * capacity + cols[i] of the [-1, dim] view:
        # one index_copy_ per table and layer
        self.flat = ((torch.arange(n).view(-1, 1) * heads + torch.arange(heads)) * capacity
                     + self.cols.view(-1, 1)).view(-1)
        self.dim = dim

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's new K/V ([n, heads, 1, dim]) at its length; the batch's view back."""
        k, v = self.slots.keys[layer_idx], self.slots.values[layer_idx]
        k.view(-1, self.dim).index_copy_(0, self.flat, key_states.reshape(-1, self.dim))
        v.view(-1, self.dim).index_copy_(0, self.flat, value_states.reshape(-1, self.dim))
        return k[:self.n, :, :self.width], v[:self.n, :, :self.width]


def additive_mask(lengths: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """[n, 1, 1, width]: 0 where row i may look (columns 0..lengths[i]), the dtype's min elsewhere."""
    seen = torch.arange(width).view(1, -1) <= lengths.view(-1, 1)
    return torch.zeros(seen.shape, dtype=dtype).masked_fill_(~seen, torch.finfo(dtype).min).view(-1, 1, 1, width)
