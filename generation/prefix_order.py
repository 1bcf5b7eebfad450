"""In which order the passages go into the prompt, so that RadixAttention finds them cached.

SGLang reuses the KV cache of the longest token prefix it has seen. With a byte-identical system
prompt first and each passage rendered identically wherever it appears, the prefix a request
shares with an earlier one is decided by the order of its passages. `PrefixTree` remembers the
passage-id sequences of recent prompts (a trie with least-recently-used eviction, per SGLang
worker where there are several); the `cache_aware` layout puts first the passages that continue
the longest remembered sequence, then the rest by a stable key, so that the same set of
passages always gives the same bytes.

A prefix can only be reused from its first passage on, so two questions on one topic that
retrieve four passages in common share nothing when the fifth sorts first in the earlier
prompt. `adopt` lets a remembered prefix bring such passages along: up to `adopt` places may go
to passages another question retrieved that lie on a remembered sequence ahead of this
prompt's own passages (the best `limit - adopt` of its own always stay).

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

    def path(self) -> list[str]:
        keys = []
        node: _Node | None = self
        while node is not None and node.parent is not None:
            keys.append(node.key)
            node = node.parent
        return keys[::-1]


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
        # Where each passage id sits in the trie: adoption starts from those nodes.
        self._where: dict[str, set[_Node]] = {}
        self._nodes = 0
        self._max_nodes = max_nodes
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._nodes

    def longest_prefix(self, passage_ids: Collection[str], *, foreign: int = 0) -> PrefixMatch:
        """The longest remembered sequence made only of `passage_ids`; among equally long ones,
        the most recently used (the likeliest to be still cached).

        With `foreign`, the sequence may also hold up to that many other passages, as long as
        it ends on one of `passage_ids`: the one holding the most of `passage_ids`, then the
        fewest others, then the most recently used."""
        wanted = set(passage_ids)
        if foreign > 0:
            return self._longest_with_foreign(wanted, foreign)
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

    def _longest_with_foreign(self, wanted: set[str], foreign: int) -> PrefixMatch:
        with self._lock:
            best: tuple[int, int, int] = (0, 0, 0)
            best_path: list[str] = []
            for key in wanted:
                for node in self._where.get(key, ()):
                    path = node.path()
                    others = sum(pid not in wanted for pid in path)
                    if others > foreign:
                        continue
                    rank = (len(path) - others, -others, node.last_used)
                    if rank > best:
                        best, best_path = rank, path
            return PrefixMatch(tuple(best_path))

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
                    self._where.setdefault(key, set()).add(child)
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
                places = self._where[node.key]
                places.discard(node)
                if not places:
                    del self._where[node.key]
                self._nodes -= 1


@dataclass(frozen=True, slots=True)
class PassageOrder:
    """Passage ids in prompt order; the first `continued` continue a remembered prefix, and
    `adopted` are those among them the ranking did not offer (see `order_ids`'s `adopt`)."""

    passage_ids: tuple[str, ...]
    continued: int = 0
    adopted: tuple[str, ...] = ()


def order_ids(
    passage_ids: Sequence[str],
    layout: PromptLayout,
    tree: PrefixTree | None = None,
    *,
    limit: int | None = None,
    slack: int = 0,
    adopt: int = 0,
) -> PassageOrder:
    """The prompt's passages and their order under `layout`.

    `passage_ids` come best first; the prompt takes `limit` of them (default: all). With
    `cache_aware` and a `slack`, up to `slack` of the last places may go to passages ranked
    just below `limit` (the candidates are the first `limit + slack`) when they continue a
    remembered prefix: the best `limit - slack` are always in. That trades a little relevance
    at the tail of the context for a longer cached prefix; its effect on answers is measured in
    the prefix-reuse benchmark.

    With `cache_aware` and `adopt`, the remembered prefix may also hold up to `adopt` passages
    that are not candidates at all (another question's), placed before candidates they lead
    to; they take places of the lowest ranked, and the best `limit - adopt` always stay.
    """
    limit = len(passage_ids) if limit is None else max(min(limit, len(passage_ids)), 0)
    if layout == "relevance":
        return PassageOrder(tuple(passage_ids[:limit]))
    if layout == "stable" or tree is None:
        return PassageOrder(tuple(sorted(passage_ids[:limit])))
    slack = max(min(slack, limit), 0)
    adopt = max(min(adopt, limit), 0)
    candidates = list(passage_ids[: limit + slack])
    offered = set(candidates)
    prefix = list(tree.longest_prefix(candidates, foreign=adopt).passage_ids[:limit])
    required = candidates[: limit - max(slack, adopt)]
    while prefix and (
        len(prefix) + sum(pid not in prefix for pid in required) > limit
        or prefix[-1] not in offered  # a prefix brings others along only to reach its own
    ):
        prefix.pop()
    taken = set(prefix)
    rest = [pid for pid in required if pid not in taken]
    rest += [pid for pid in candidates if pid not in taken and pid not in rest]
    rest = rest[: limit - len(prefix)]
    adopted = tuple(pid for pid in prefix if pid not in offered)
    return PassageOrder((*prefix, *sorted(rest)), len(prefix), adopted)
