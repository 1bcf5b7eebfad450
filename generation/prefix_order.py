"""In which order the passages go into the prompt, so that RadixAttention finds them cached.

SGLang reuses the KV cache of the longest token prefix it has seen. With a byte-identical system
prompt first and each passage rendered identically wherever it appears, the prefix a request
shares with an earlier one is decided by the order of its passages. `PrefixTree` remembers the
passage-id sequences of recent prompts (a trie with least-recently-used eviction, per SGLang
worker where there are several); the `cache_aware` layout puts first the passages that continue
the longest remembered sequence, then the rest by a stable key, so that the same set of
passages always gives the same bytes.

Layouts (a setting the planner may choose per request; position affects answers, so each is
measured for quality in the prefix-reuse benchmark):

- `relevance`: the retrieval order, best first (what most RAG systems do).
- `stable`: sorted by passage id: the same set of passages gives the same prompt.
- `cache_aware`: the longest remembered prefix first, then the rest as `stable`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

PromptLayout = Literal["relevance", "stable", "cache_aware"]
PROMPT_LAYOUTS: tuple[PromptLayout, ...] = ("relevance", "stable", "cache_aware")


@dataclass(slots=True, eq=False)
class _Node:
    key: str
    parent: _Node | None
    children: dict[str, _Node] = field(default_factory=dict)
    last_used: int = 0


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The remembered prefix a set of passages can continue: its ids, in prompt order."""

    passage_ids: tuple[str, ...]


class PrefixTree:
    """Passage-id sequences of recent prompts, as a trie bounded to `max_nodes` nodes.

    Thread-safe: prompts are laid out in worker threads.
    """

    def __init__(self, max_nodes: int = 20_000) -> None:
        if max_nodes < 1:
            raise ValueError("max_nodes must be at least 1")
        self._root = _Node("", None)
        self._nodes = 0
        self._max_nodes = max_nodes
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._nodes

    def longest_prefix(self, passage_ids: Collection[str]) -> PrefixMatch:
        """The longest remembered sequence made only of `passage_ids`; among equally long ones,
        the most recently used (the likeliest to be still cached)."""
        wanted = set(passage_ids)
        with self._lock:
            best: tuple[int, int, list[str]] = (0, 0, [])
            stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
            while stack:
                node, path = stack.pop()
                rank = (len(path), node.last_used)
                if rank > best[:2]:
                    best = (rank[0], rank[1], path)
                for key, child in node.children.items():
                    if key in wanted and key not in path:
                        stack.append((child, [*path, key]))
            return PrefixMatch(tuple(best[2]))

    def insert(self, passage_ids: Sequence[str]) -> None:
        """Remember a prompt's passage sequence (marking its nodes as just used)."""
        with self._lock:
            now = next(self._clock)
            node = self._root
            node.last_used = now
            for key in passage_ids:
                child = node.children.get(key)
                if child is None:
                    child = _Node(key, node)
                    node.children[key] = child
                    self._nodes += 1
                child.last_used = now
                node = child
            if self._nodes > self._max_nodes:
                self._evict(self._max_nodes * 9 // 10)

    def _evict(self, keep: int) -> None:
        """Drop least recently used nodes until `keep` remain, leaves first.

        A node is never used later than its parent (an insert marks the whole path), so in
        order of (last use, deeper first) every node is a leaf by the time its turn comes.
        """
        nodes: list[tuple[int, int, _Node]] = []
        stack: list[tuple[_Node, int]] = [(child, 1) for child in self._root.children.values()]
        while stack:
            node, depth = stack.pop()
            nodes.append((node.last_used, -depth, node))
            stack.extend((child, depth + 1) for child in node.children.values())
        nodes.sort(key=lambda item: item[:2])
        for _, _, node in nodes[: max(self._nodes - keep, 0)]:
            if node.parent is not None and not node.children:
                del node.parent.children[node.key]
                self._nodes -= 1


@dataclass(frozen=True, slots=True)
class PassageOrder:
    """Passage ids in prompt order; the first `continued` continue a remembered prefix."""

    passage_ids: tuple[str, ...]
    continued: int = 0


def order_ids(
    passage_ids: Sequence[str],
    layout: PromptLayout,
    tree: PrefixTree | None = None,
    *,
    limit: int | None = None,
    slack: int = 0,
) -> PassageOrder:
    """The prompt's passages and their order under `layout`.

    `passage_ids` come best first; the prompt takes `limit` of them (default: all). With
    `cache_aware` and a `slack`, up to `slack` of the last places may go to passages ranked
    just below `limit` (the candidates are the first `limit + slack`) when they continue a
    remembered prefix: the best `limit - slack` are always in. That trades a little relevance
    at the tail of the context for a longer cached prefix; its effect on answers is measured in
    the prefix-reuse benchmark.
    """
    limit = len(passage_ids) if limit is None else max(min(limit, len(passage_ids)), 0)
    if layout == "relevance":
        return PassageOrder(tuple(passage_ids[:limit]))
    if layout == "stable" or tree is None:
        return PassageOrder(tuple(sorted(passage_ids[:limit])))
    slack = max(min(slack, limit), 0)
    candidates = list(passage_ids[: limit + slack])
    prefix = list(tree.longest_prefix(candidates).passage_ids[:limit])
    required = candidates[: limit - slack]
    while len(prefix) + sum(pid not in prefix for pid in required) > limit:
        prefix.pop()
    taken = set(prefix)
    rest = [pid for pid in required if pid not in taken]
    rest += [pid for pid in candidates if pid not in taken and pid not in rest]
    rest = rest[: limit - len(prefix)]
    return PassageOrder((*prefix, *sorted(rest)), len(prefix))
