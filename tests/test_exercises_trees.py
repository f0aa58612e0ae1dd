"""The checkers of deep dive 07a (trees, heads, batch invariance) pass the answer derived from the statement and
fail the plausible wrong ones: the off-by-one in greedy verification, a tree that forgets the second candidate or
its main chain, and a causal mask where a tree mask belongs."""
import pytest
import torch

from tests.conftest import assert_checker_separates


def _accept(logits, draft, *, shift=0, bonus_row=None):
    best = logits.argmax(-1).tolist()
    k = 0
    while k < len(draft) and k + shift < len(best) and draft[k] == best[k + shift]:
        k += 1
    return k, best[k if bonus_row is None else bonus_row(k)]


@pytest.mark.parametrize("wrong", [
    lambda lg, d: _accept(lg, d, shift=1),                                # draft i checked against row i + 1
    lambda lg, d: _accept(lg, d, bonus_row=lambda k: len(d)),             # bonus always from the last row
    lambda lg, d: _accept(lg, d, bonus_row=lambda k: max(0, k - 1)),      # bonus from the last accepted row
    lambda lg, d: (sum(int(a == b) for a, b in zip(d, lg.argmax(-1).tolist())),  # counts matches past a miss
                   int(lg[sum(int(a == b) for a, b in zip(d, lg.argmax(-1).tolist()))].argmax())),
])
def test_the_greedy_checker_separates(wrong, capsys):
    assert_checker_separates("check_accept_greedy", _accept, wrong, capsys)


def _gain(alpha, second, nodes, *, drop_second=False, chain_len=None, main_len=None):
    main = sum(alpha ** i for i in range(1, (nodes - 2) if main_len is None else main_len(nodes)))
    tree = alpha * (1 + main) + (0 if drop_second else (1 - alpha) * second)
    chain = sum(alpha ** i for i in range(1, nodes if chain_len is None else chain_len(nodes)))
    return tree - chain


@pytest.mark.parametrize("wrong", [
    lambda a, s, n: _gain(a, s, n, drop_second=True),                 # the second candidate adds nothing
    lambda a, s, n: _gain(a, s, n, main_len=lambda n: n - 1),         # the tree's main chain as long as the chain
    lambda a, s, n: _gain(a, s, n, chain_len=lambda n: n + 1),        # the chain drafts `nodes` tokens
    lambda a, s, n: _gain(a, s, n) - (1 - a) * s + s,                 # the second tried even when the first passed
])
def test_the_tree_gain_checker_separates(wrong, capsys):
    assert_checker_separates("check_tree_gain", _gain, wrong, capsys)


def _mask(parents, prefix_len, *, causal=False, no_self=False, no_prefix=False):
    n = len(parents)
    seen = torch.tril(torch.ones(n, n, dtype=torch.bool)) if causal else torch.eye(n, dtype=torch.bool)
    if not causal:
        for i in range(1, n):
            seen[i] |= seen[parents[i]]
    if no_self:
        seen &= ~torch.eye(n, dtype=torch.bool)
    return torch.cat([torch.full((n, prefix_len), not no_prefix), seen], dim=1)


@pytest.mark.parametrize("wrong", [
    lambda p, pl: _mask(p, pl, causal=True),       # a chain's causal mask: siblings see each other
    lambda p, pl: _mask(p, pl, no_self=True),      # a node that cannot see itself
    lambda p, pl: _mask(p, pl, no_prefix=True),    # the cached prefix hidden
    lambda p, pl: _mask(p, pl)[:, pl:],            # the prefix columns left out
])
def test_the_tree_mask_checker_separates(wrong, capsys):
    assert_checker_separates("check_tree_mask", _mask, wrong, capsys)
