"""The engine's prefix cache: a radix tree of prompt token ids, as SGLang's RadixCache keeps it.

What it follows (SGLang 0.5.23, sglang/srt/mem_cache/radix_cache.py and mem_cache/common.py; 0.5.17
is the same where the sim looks):

- keys are token ids cut to a multiple of `--page-size` (`RadixKey.page_aligned`): a hit is a whole
  number of pages, and a page only partly shared is not a hit;
- a lookup updates the access time of every node on the matched path, and splits a node where the
  match ends inside it (`match_prefix`);
- a request locks the path to its last matched node while it runs (`inc_lock_ref` up to the root):
  locked tokens are *protected*, the rest *evictable*;
- eviction frees unlocked leaves, least recently used first (`--radix-eviction-policy lru`, the
  default) or least frequently used (`lfu`, ties by age); a parent left without children becomes a
  leaf and may go next. SGLang's other policies (priority, slru, tlru) are not modelled: the sim
  evicts LRU under them.

The cache holds tokens, not tensors: its size counts against the engine's KV pool (the scheduler
does the accounting, pdkit/sim/scheduler.py). A disabled cache (`--disable-radix-cache`, or a PD
decode without `--disaggregation-decode-enable-radix-cache`) never matches and never stores.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

EVICTION_POLICIES = ("lru", "lfu")


class Node:
    __slots__ = ("key", "children", "parent", "lock_ref", "last_access", "hits")

    def __init__(self, key: tuple[int, ...], parent: Node | None) -> None:
        self.key = key
        self.children: dict[tuple[int, ...], Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0
        self.hits = 0


def _common_len(a: tuple[int, ...], b: Sequence[int], start: int, end: int) -> int:
    """Length of the common prefix of `a` and `b[start:end]` (slices compare in C; bisect on a mismatch)."""
    n = min(len(a), end - start)
    if a[:n] == tuple(b[start:start + n]):
        return n
    lo, hi = 0, n  # a[:lo] matches, a[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == tuple(b[start:start + mid]):
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    def __init__(self, page_size: int = 1, enabled: bool = True, policy: str = "lru") -> None:
        self.page = max(1, page_size)
        self.enabled = enabled
        self.policy = policy if policy in EVICTION_POLICIES else "lru"
        self.root = Node((), None)
        self.root.lock_ref = 1  # never evicted
        self._clock = itertools.count(1)
        self.total_size = 0
        self.evictable_size = 0

    @property
    def protected_size(self) -> int:
        return self.total_size - self.evictable_size

    def aligned(self, n: int) -> int:
        return n // self.page * self.page

    # ---- lookup and insertion ----------------------------------------------------------------

    def _child_key(self, ids: Sequence[int], pos: int) -> tuple[int, ...]:
        return tuple(ids[pos:pos + self.page])

    def _split(self, node: Node, n: int) -> Node:
        """Cut `node` after its first n tokens (a page multiple); return the new upper part."""
        assert node.parent is not None
        upper = Node(node.key[:n], node.parent)
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        upper.hits = node.hits
        node.parent.children[upper.key[:self.page]] = upper
        node.key = node.key[n:]
        node.parent = upper
        upper.children[node.key[:self.page]] = node
        return upper

    def _walk(self, ids: Sequence[int], length: int) -> tuple[Node, int]:
        """Follow the first `length` (page-aligned) ids down the tree: (last node, tokens matched)."""
        node, pos = self.root, 0
        stamp = next(self._clock)
        while pos < length:
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                break
            n = self.aligned(_common_len(child.key, ids, pos, length))
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = stamp
            child.hits += 1
            node, pos = child, pos + n
            if n < len(node.key):
                break
        return node, pos

    def match(self, ids: Sequence[int], limit: int | None = None) -> tuple[int, Node]:
        """The cached prefix of `ids[:limit]`, page-aligned: (tokens, its last node)."""
        if not self.enabled:
            return 0, self.root
        length = self.aligned(len(ids) if limit is None else max(0, min(limit, len(ids))))
        node, matched = self._walk(ids, length)
        return matched, node

    def insert(self, ids: Sequence[int]) -> tuple[int, Node]:
        """Store the page-aligned prefix of `ids`; (tokens stored in the tree for it, its last node).

        New nodes start unlocked (evictable); the caller locks what its request still uses."""
        if not self.enabled:
            return 0, self.root
        length = self.aligned(len(ids))
        node, pos = self._walk(ids, length)
        if pos < length:
            leaf = Node(tuple(ids[pos:length]), node)
            leaf.last_access = next(self._clock)
            node.children[leaf.key[:self.page]] = leaf
            self.total_size += len(leaf.key)
            self.evictable_size += len(leaf.key)
            node = leaf
        return length, node

    # ---- locks ---------------------------------------------------------------------------------

    def lock_delta(self, node: Node) -> int:
        """Tokens that locking `node` would move from evictable to protected."""
        out = 0
        while node is not self.root and node.lock_ref == 0:
            out += len(node.key)
            node = node.parent  # type: ignore[assignment]
        return out

    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
            node = node.parent  # type: ignore[assignment]

    # ---- eviction ------------------------------------------------------------------------------

    def _priority(self, node: Node) -> tuple[int, int]:
        return (node.hits, node.last_access) if self.policy == "lfu" else (node.last_access, 0)

    def evict(self, tokens: int) -> int:
        """Free at least `tokens` of unlocked leaves, policy order; returns the tokens freed."""
        if tokens <= 0 or self.evictable_size == 0:
            return 0
        heap = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if not n.children and n.lock_ref == 0 and n is not self.root:
                heap.append((self._priority(n), id(n), n))
        heapq.heapify(heap)
        freed = 0
        while heap and freed < tokens:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[:self.page]]
            freed += len(node.key)
            self.total_size -= len(node.key)
            self.evictable_size -= len(node.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self._priority(parent), id(parent), parent))
        return freed

    def reset(self) -> bool:
        """/flush_cache: drop everything, only when nothing is locked (SGLang refuses otherwise)."""
        if self.protected_size:
            return False
        self.root.children.clear()
        self.total_size = self.evictable_size = 0
        return True
