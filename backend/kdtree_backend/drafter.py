"""The stand-in's drafter and the acceptance rule of tree speculative decoding (pure, no torch).

The drafter is an n-gram lookup over the request's own context (SGLang's NGRAM algorithm works the same way): the
continuations that followed earlier occurrences of the context's last 1..``max_match`` tokens, longest match and
most recent first, merged into a token tree of ``q_len`` nodes. Node 0 is the root: the last token of the context
(the previous step's bonus token, whose KV the verify step writes); nodes are in topological order (a parent
before its children). Nodes the n-grams do not fill are padded as children of the root (SGLang pads too: the
verify shape is static).

Acceptance (greedy): from the root, follow the child whose token is the target's greedy token after the current
node, while there is one; the tokens of that path, plus the target's token after its last node (the bonus), are
the step's new tokens. A step therefore always yields at least one token, and at most the tree's depth + 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

PAD_TOKEN = 0
MAX_MATCH = 3
MAX_CANDIDATES = 8  # continuations merged into one tree


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]  # node -> token; node 0 is the root (the context's last token)
    parents: tuple[int, ...]  # node -> parent node; -1 for the root

    @property
    def size(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        depth = [0] * self.size
        for node in range(1, self.size):
            depth[node] = depth[self.parents[node]] + 1
        return depth

    def children(self, node: int) -> list[int]:
        return [child for child in range(1, self.size) if self.parents[child] == node]


def continuations(context: Sequence[int], depth: int, max_match: int = MAX_MATCH) -> list[tuple[int, ...]]:
    """What followed earlier occurrences of the context's suffix: longest suffix match first, then most recent,
    each at most ``depth`` tokens, no duplicates."""
    n = len(context)
    found: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    for match in range(min(max_match, n - 1), 0, -1):
        suffix = tuple(context[n - match :])
        for end in range(n - 1, match - 1, -1):  # the occurrence ends at context[end - 1]
            if tuple(context[end - match : end]) != suffix:
                continue
            follow = tuple(context[end : end + depth])
            if follow and follow not in seen:
                seen.add(follow)
                found.append(follow)
            if len(found) >= MAX_CANDIDATES:
                return found
    return found


Guess = Callable[[int], Sequence[int]]  # a draft model: token -> its likeliest next tokens, best first


def _chain(guess: Guess, token: int, length: int) -> tuple[int, ...]:
    out: list[int] = []
    for _ in range(length):
        token = guess(token)[0]
        out.append(token)
    return tuple(out)


def candidates(context: Sequence[int], q_len: int, guess: Guess | None) -> list[tuple[int, ...]]:
    """Continuations to merge into the tree, best first: the draft model's greedy chain (up to half the nodes),
    the n-gram continuations, then the draft model's runner-up after the root and after its first guess."""
    budget = q_len - 1
    if guess is None:
        return continuations(context, budget)
    chain = _chain(guess, context[-1], max(1, budget // 2))
    runner_ups = [(t,) for t in guess(context[-1])[1:2]]
    runner_ups += [(chain[0], t) for t in guess(chain[0])[1:2]]
    return [chain, *continuations(context, budget), *runner_ups]


def propose(context: Sequence[int], q_len: int, guess: Guess | None = None) -> DraftTree:
    """A draft tree of exactly ``q_len`` nodes for the next verify step of ``context`` (non-empty); ``guess``: an
    optional draft model whose guesses join the n-grams."""
    if not context or q_len < 1:
        raise ValueError(f"a draft tree needs a non-empty context and q_len >= 1, got {len(context)}, {q_len}")
    tokens, parents = [context[-1]], [-1]
    child_of: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for follow in candidates(context, q_len, guess):
        node = 0
        for token in follow:
            if len(tokens) >= q_len:
                break
            nxt = child_of.get((node, token))
            if nxt is None:
                nxt = len(tokens)
                tokens.append(token)
                parents.append(node)
                child_of[(node, token)] = nxt
            node = nxt
    while len(tokens) < q_len:
        tokens.append(PAD_TOKEN)
        parents.append(0)
    return DraftTree(tuple(tokens), tuple(parents))


@dataclass(frozen=True)
class Accepted:
    path: tuple[int, ...]  # the accepted draft nodes, root excluded, in order
    tokens: tuple[int, ...]  # the step's new tokens: the accepted drafts' tokens, then the bonus token

    @property
    def drafts(self) -> int:
        return len(self.path)


def accept(tree: DraftTree, target: Sequence[int]) -> Accepted:
    """Greedy acceptance: ``target[node]`` is the target model's token after ``node`` (one per node)."""
    if len(target) != tree.size:
        raise ValueError(f"one target token per node: {len(target)} for {tree.size} nodes")
    path: list[int] = []
    node = 0
    while True:
        match = next((c for c in tree.children(node) if tree.tokens[c] == target[node]), None)
        if match is None:
            break
        path.append(match)
        node = match
    return Accepted(tuple(path), (*(tree.tokens[n] for n in path), target[node]))
