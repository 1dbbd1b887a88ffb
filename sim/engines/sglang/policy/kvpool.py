"""The KV cache pool in pages, and decode's per-step page demand in O(1).

SGLang's token-to-KV allocator hands out pages of ``page_size`` tokens (``--page-size``,
1 by default); token usage is allocated pages x page_size over the pool size. A request's
private KV (the tokens beyond the prefix it shares through the radix cache) occupies
ceil(tokens / page_size) pages. Each decode step writes one token per request, so a request
needs a new page in the step where its private length is a multiple of the page size
(``new_tokens_required_next_decode`` / ``new_page_count_next_decode``).

The decode demand is counted by residue class: a request that joined the running batch
before decode batch ``join_seq`` holding ``kv_base`` private tokens holds
``kv_base + (g - join_seq)`` before batch ``g`` and needs a page in ``g`` when that is
0 mod page_size, i.e. when ``(kv_base - join_seq) % page_size == (-g) % page_size``.
"""

from __future__ import annotations


class KVPool:
    """A KV pool of ``size_tokens`` tokens in pages of ``page_size`` tokens.

    Raises:
        ValueError: ``size_tokens`` is not a positive multiple of ``page_size``.
    """

    def __init__(self, size_tokens: int, page_size: int = 1):
        if page_size < 1 or size_tokens < page_size or size_tokens % page_size:
            raise ValueError(f"KV pool of {size_tokens} tokens is not a positive multiple of page_size {page_size}")
        self.page_size = page_size
        self.total_pages = size_tokens // page_size
        self.used_pages = 0
        self.peak_pages = 0

    @property
    def size_tokens(self) -> int:
        return self.total_pages * self.page_size

    @property
    def used_tokens(self) -> int:
        """Allocated tokens, page-rounded (what SGLang logs as ``#token``)."""
        return self.used_pages * self.page_size

    @property
    def peak_tokens(self) -> int:
        return self.peak_pages * self.page_size

    @property
    def free_pages(self) -> int:
        return self.total_pages - self.used_pages

    def usage(self) -> float:
        """Token usage: allocated fraction of the pool (SGLang's ``token usage``)."""
        return self.used_pages / self.total_pages

    def pages(self, tokens: int) -> int:
        """Pages that hold ``tokens`` private tokens."""
        return -(-tokens // self.page_size)

    def ceil(self, tokens: int) -> int:
        """``tokens`` rounded up to whole pages (tokens)."""
        return -(-tokens // self.page_size) * self.page_size

    def floor(self, tokens: int) -> int:
        """``tokens`` rounded down to whole pages (tokens)."""
        return tokens // self.page_size * self.page_size

    def grow(self, held_tokens: int, add_tokens: int) -> int:
        """Pages a request holding ``held_tokens`` needs to add ``add_tokens`` more."""
        return self.pages(held_tokens + add_tokens) - self.pages(held_tokens)

    def needs_page(self, held_tokens: int) -> bool:
        """Whether writing one more token to a request holding ``held_tokens`` takes a new page."""
        return held_tokens % self.page_size == 0

    def alloc(self, pages: int) -> None:
        """Take ``pages`` (the caller has checked they are free)."""
        self.used_pages += pages
        if self.used_pages > self.peak_pages:
            self.peak_pages = self.used_pages

    def free(self, pages: int) -> None:
        self.used_pages -= pages


class DecodePageDemand:
    """How many running requests need a new page in decode batch ``g``: O(1) per step.

    Counts running requests by ``(kv_base - join_seq) % page_size`` (see the module docstring).
    """

    def __init__(self, page_size: int):
        self.page_size = page_size
        self._count = [0] * page_size

    def residue(self, kv_base: int, join_seq: int) -> int:
        return (kv_base - join_seq) % self.page_size

    def add(self, kv_base: int, join_seq: int) -> None:
        self._count[self.residue(kv_base, join_seq)] += 1

    def remove(self, kv_base: int, join_seq: int) -> None:
        self._count[self.residue(kv_base, join_seq)] -= 1

    def add_all(self, reqs) -> None:
        """:meth:`add` of each of ``reqs`` (requests with ``kv_base`` and ``join_seq``)."""
        count, page = self._count, self.page_size
        for r in reqs:
            count[(r.kv_base - r.join_seq) % page] += 1  # (residue)

    def remove_all(self, reqs) -> None:
        """:meth:`remove` of each of ``reqs`` (requests with ``kv_base`` and ``join_seq``)."""
        count, page = self._count, self.page_size
        for r in reqs:
            count[(r.kv_base - r.join_seq) % page] -= 1  # (residue)

    def need(self, g: int) -> int:
        """Running requests that take a new page in decode batch ``g``."""
        return self._count[(-g) % self.page_size]

    def member_needs(self, kv_base: int, join_seq: int, g: int) -> bool:
        """Whether one request (joined at ``join_seq`` with ``kv_base`` tokens) takes a page in ``g``."""
        return self.residue(kv_base, join_seq) == (-g) % self.page_size
