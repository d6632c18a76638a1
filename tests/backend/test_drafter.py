"""The stand-in's drafter and greedy acceptance (pure): the tree's shape, what it proposes, and how many tokens a
verify step yields."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kdtree_backend.drafter import PAD_TOKEN, DraftTree, accept, continuations, propose


def test_continuations_longest_match_first_then_most_recent() -> None:
    context = [1, 2, 3, 9, 2, 3, 7, 5, 3, 8, 2, 3]
    # suffix (2, 3) matched twice (ending before index 6, then before 3), then suffix (3,) alone (before 9)
    assert continuations(context, depth=2) == [(7, 5), (9, 2), (8, 2)]


def test_propose_merges_continuations_into_a_tree_rooted_at_the_last_token() -> None:
    tree = propose([4, 5, 6, 4, 5, 7, 4, 5], q_len=6)
    assert tree.tokens[0] == 5 and tree.parents[0] == -1
    # after "4 5": 7 then 4 (most recent first), and 6 4 5 further back: 7-4-5, 6-4
    assert tree.tokens == (5, 7, 4, 5, 6, 4)
    assert tree.parents == (-1, 0, 1, 2, 0, 4)
    assert tree.depths() == [0, 1, 2, 3, 1, 2]


def test_a_context_without_repeats_is_padded_to_q_len() -> None:
    tree = propose([1, 2, 3], q_len=4)
    assert tree.tokens == (3, PAD_TOKEN, PAD_TOKEN, PAD_TOKEN) and tree.parents == (-1, 0, 0, 0)


def test_the_draft_model_chain_comes_first() -> None:
    tree = propose([1, 2, 3], q_len=5, guess=lambda token: (token + 10, token + 20))
    assert tree.tokens[:3] == (3, 13, 23)  # the chain: half the drafts
    assert tree.parents[:3] == (-1, 0, 1)
    assert set(tree.tokens[3:]) == {23, 33}  # runner-ups after the root and after the first guess


def test_accept_follows_matching_children_then_adds_the_bonus() -> None:
    tree = DraftTree(tokens=(5, 7, 4, 9, 6), parents=(-1, 0, 1, 1, 0))
    # target after root: 7 (node 1 matches); after node 1: 9 (node 3 matches); after node 3: 42 (bonus)
    result = accept(tree, [7, 9, 0, 42, 0])
    assert result.path == (1, 3) and result.tokens == (7, 9, 42) and result.drafts == 2
    # nothing matches: one token per step, the target's own
    assert accept(tree, [8, 0, 0, 0, 0]).tokens == (8,)
    # the second child of the root
    assert accept(tree, [6, 0, 0, 0, 11]).tokens == (6, 11)


@settings(max_examples=200, deadline=None)
@given(
    context=st.lists(st.integers(0, 6), min_size=1, max_size=40),
    q_len=st.integers(1, 12),
    target=st.lists(st.integers(0, 6), min_size=12, max_size=12),
)
def test_every_tree_is_well_formed_and_a_step_yields_1_to_depth_plus_1_tokens(
    context: list[int], q_len: int, target: list[int]
) -> None:
    tree = propose(context, q_len)
    assert tree.size == q_len and tree.tokens[0] == context[-1]
    assert all(0 <= tree.parents[n] < n for n in range(1, q_len))  # topological
    result = accept(tree, target[:q_len])
    depth = max(tree.depths())
    assert 1 <= len(result.tokens) <= depth + 1 and result.drafts == len(result.tokens) - 1
    node = 0
    for child, token in zip(result.path, result.tokens, strict=False):  # a chain of matches from the root
        assert tree.parents[child] == node and target[node] == token == tree.tokens[child]
        node = child
    assert result.tokens[-1] == target[node]
