"""KV memory accounting: token slots from a free list (SGLang ``TokenToKVPoolAllocator``, page
size 1) and request slots (SGLang ``ReqToTokenPool``).

The token free list is an int64 array: ``alloc`` slices its head, ``free`` appends, as SGLang
does with its ``free_pages`` tensor (kept here on the host so every backend shares it).
"""

from __future__ import annotations

import numpy as np


class TokenSlotAllocator:
    """``size`` KV token slots, numbered 1..size (0 is SGLang's padding slot)."""

    def __init__(self, size: int):
        self.size = size
        self.free_slots = np.arange(1, size + 1, dtype=np.int64)

    def available_size(self) -> int:
        """Free token slots."""
        return len(self.free_slots)

    def alloc(self, n: int) -> np.ndarray | None:
        """``n`` slot indices, or None when fewer are free (the caller evicts or retracts)."""
        if n > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, indices: np.ndarray) -> None:
        """Return slots to the free list."""
        if len(indices):
            self.free_slots = np.concatenate((self.free_slots, indices))


class ReqSlotAllocator:
    """``max_reqs`` request slots (rows of the model's KV cache)."""

    def __init__(self, max_reqs: int):
        self.max_reqs = max_reqs
        self.free_slots = list(range(max_reqs))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> int | None:
        """A free request slot, or None when all are in use."""
        return self.free_slots.pop() if self.free_slots else None

    def free(self, slot: int) -> None:
        self.free_slots.append(slot)
