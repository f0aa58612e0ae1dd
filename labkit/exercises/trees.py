"""Exercises of deep dive 07a: greedy verification (a debug exercise), what a tree buys over a chain at the same
number of verified tokens (a derivation), and the tree attention mask (a debug exercise).

The references are labkit's own: `speculative.tree.verify_greedy` on a chain, and `TokenTree.mask`.
"""
from __future__ import annotations

import torch

from labkit.exercises._core import Verdict, check

__all__ = ["check_accept_greedy", "check_tree_gain", "check_tree_mask"]


def _accept_greedy(logits, draft):
    from labkit.speculative.tree import TokenTree, verify_greedy

    tree = TokenTree.from_parents([0, *draft], [-1, *range(len(draft))])
    path, bonus = verify_greedy(tree, logits.argmax(-1).tolist())
    return len(path) - 1, bonus


def _greedy_cases():
    gen = torch.Generator().manual_seed(7)
    cases = []
    for gamma, agree in ((3, 0), (3, 1), (3, 3), (1, 0), (1, 1), (5, 2), (4, 4), (0, 0)):
        # integer-valued logits: the same on every CPU (a failing case prints them)
        logits = torch.randint(-30, 30, (gamma + 1, 11), generator=gen).float() / 10
        best = logits.argmax(-1).tolist()
        draft = best[:agree] + [(best[i] + 1) % 11 for i in range(agree, gamma)]
        cases.append((logits, draft))
    # the draft's first token is what the target predicts at the *last* position: an off-by-one reads it
    logits = torch.zeros(3, 5)
    logits[0, 2] = logits[1, 4] = logits[2, 1] = 1.0
    cases += [(logits, [2, 4]), (logits, [4, 1]), (logits, [2, 1]), (logits, [3, 4])]  # the last: a miss, a match
    return cases


def check_accept_greedy(fn) -> Verdict:
    """Check `fn(logits, draft) -> (accepted, bonus)`: `logits` [γ + 1, V] are the target's over the last accepted
    token and the γ drafts (row i predicts what follows position i), `draft` the γ drafted token ids. `accepted`:
    how many drafts equal the target's greedy choice, in order up to the first that does not; `bonus`: the
    target's own token after them."""
    return check("accept_greedy", fn, _accept_greedy, _greedy_cases(),
                 hint="write out which row of the logits saw which tokens as its input, for the printed case: the "
                      "first row's input is the last accepted token, not the first draft")


def _tree_gain(alpha, second, nodes):
    main = sum(alpha ** i for i in range(1, nodes - 2))  # the first candidate's chain below it: nodes - 3 drafts
    tree = alpha * (1 + main) + (1 - alpha) * second
    chain = sum(alpha ** i for i in range(1, nodes))
    return tree - chain


def check_tree_gain(fn) -> Verdict:
    """Check `fn(alpha, second, nodes) -> float`: expected accepted drafts per pass of a tree minus those of a chain
    that verifies the same `nodes` tokens. Chain: γ = nodes - 1 drafts, each accepted with probability `alpha` given
    that the ones before it were. Tree: the draft's top two candidates at the first position; the first (accepted
    with probability `alpha`) carries a chain of nodes - 3 drafts below it (each `alpha`), the second has no
    children and is accepted with probability `second` when the first is not."""
    cases = [(0.5, 0.0, 3), (0.5, 0.5, 3), (0.8, 0.5, 5), (0.3, 0.4, 5), (0.9, 0.9, 4), (0.0, 0.7, 6),
             (1.0, 0.5, 5), (0.6, 0.2, 8), (0.7, 1.0, 3)]
    return check("tree_gain", fn, _tree_gain, cases,
                 hint="check limits: with alpha = 1 a chain accepts every draft; with alpha = 0 only the tree's "
                      "second candidate can pass; and count the drafts each side verifies: both use `nodes` tokens")


def _tree_mask(parents, prefix_len):
    from labkit.speculative.tree import TokenTree

    return TokenTree.from_parents(list(range(len(parents))), parents).mask(prefix_len)


def check_tree_mask(fn) -> Verdict:
    """Check `fn(parents, prefix_len) -> bool tensor [n, prefix_len + n]`: which positions node i may attend to
    when the tree (node 0 the root, `parents[i]` the parent of node i, -1 for the root) is verified after
    `prefix_len` cached tokens: every cached token, then node i itself and its ancestors, nothing else."""
    cases = [([-1, 0, 1, 2], 3), ([-1, 0, 0], 2), ([-1, 0, 0, 1, 2], 4), ([-1, 0, 0, 1, 1, 3], 0),
             ([-1], 5), ([-1, 0, 1, 0, 3, 2], 1)]
    return check("tree_mask", fn, _tree_mask, cases,
                 hint="a node sees its own path from the root, not its siblings or their children, even when they "
                      "come earlier in the node order; a chain's mask is causal, a tree's is not")
