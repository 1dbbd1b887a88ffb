"""A radix tree over token ids mapping cached prefixes to KV slot indices (SGLang ``RadixCache``,
page size 1): prefix match, insert, lock references, LRU eviction.

Keys are compared token by token in Python, as SGLang's ``_key_match_page_size1`` does; the
cost of a match therefore grows with the matched length, which is what the ``schedule`` phase
pays per new request.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable, Sequence

import numpy as np

_clock = itertools.count()


class TreeNode:
    """One edge of the tree: ``key`` (token ids) and ``value`` (their KV slot indices)."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access")

    def __init__(self, parent: "TreeNode | None" = None, key: list[int] | None = None,
                 value: np.ndarray | None = None):
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.key: list[int] = key or []
        self.value = value if value is not None else np.empty(0, dtype=np.int64)
        self.lock_ref = 0
        self.last_access = next(_clock)

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access < other.last_access


def _key_match(a: Sequence[int], b: Sequence[int]) -> int:
    i = 0
    for x, y in zip(a, b):
        if x != y:
            break
        i += 1
    return i


class RadixCache:
    """Prefix cache of token sequences. Sizes are in tokens (= KV slots)."""

    def __init__(self) -> None:
        self.root = TreeNode()
        self.root.lock_ref = 1
        self.total_size = 0
        self.evictable_size = 0

    def match_prefix(self, key: Sequence[int]) -> tuple[np.ndarray, TreeNode]:
        """The longest cached prefix of ``key``: (its KV indices, the node where it ends).

        A match that ends inside an edge splits it, so the returned node covers the prefix
        exactly (SGLang ``RadixCache.match_prefix``)."""
        node, values, pos = self.root, [], 0
        node.last_access = next(_clock)
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            child.last_access = next(_clock)
            n = _key_match(child.key, key[pos:pos + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
                values.append(child.value)
                node = child
                break
            values.append(child.value)
            pos += n
            node = child
        kv = np.concatenate(values) if values else np.empty(0, dtype=np.int64)
        return kv, node

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        new = TreeNode(child.parent, child.key[:n], child.value[:n])
        new.lock_ref = child.lock_ref
        new.children = {child.key[n]: child}
        new.parent.children[child.key[0]] = new
        child.parent, child.key, child.value = new, child.key[n:], child.value[n:]
        return new

    def insert(self, key: Sequence[int], value: np.ndarray) -> int:
        """Insert ``key`` with KV indices ``value`` (same length). Returns how many leading
        tokens were already cached: the caller frees its duplicate indices for them
        (SGLang ``cache_finished_req`` / ``cache_unfinished_req``)."""
        key = list(key)
        node, pos = self.root, 0
        node.last_access = next(_clock)
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = TreeNode(node, key[pos:], np.asarray(value[pos:], dtype=np.int64))
                node.children[key[pos]] = leaf
                added = len(leaf.key)
                self.total_size += added
                self.evictable_size += added
                return pos
            child.last_access = next(_clock)
            n = _key_match(child.key, key[pos:])
            if n < len(child.key):
                child = self._split(child, n)
            pos += n
            node = child
        return pos

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect the path to ``node`` from eviction (a running request uses it)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo :meth:`inc_lock_ref`."""
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
            node = node.parent

    def evict(self, num_tokens: int, free: Callable[[np.ndarray], None]) -> int:
        """Evict least-recently-used unlocked leaves until ``num_tokens`` are freed (or none is
        left); ``free`` receives each evicted node's KV indices. Returns tokens evicted."""
        heap = [n for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        done = 0
        while done < num_tokens and heap:
            leaf = heapq.heappop(heap)
            free(leaf.value)
            done += len(leaf.key)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            self.total_size -= len(leaf.key)
            self.evictable_size -= len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, parent)
        return done

    def _leaves(self) -> list[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if not n.children and n is not self.root:
                out.append(n)
            stack.extend(n.children.values())
        return out
