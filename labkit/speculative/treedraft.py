"""Drafters that propose token trees, each behind one method, `propose_tree`.

    tree = drafter.propose_tree(history, max_nodes, params, generator)   # a TokenTree, at most max_nodes nodes

The root is `history[-1]`, the last emitted token; `max_nodes` counts it (a chain of γ drafts
is γ + 1 nodes).

- `TreeLookup`: prompt lookup with several matches: the continuations after the last few
  earlier occurrences of the history's suffix n-gram (`PromptLookup.matches`), merged into a
  trie and cut to the budget by how many matches agree (SpecInfer's merge of many guesses,
  Miao et al. 2024, with n-gram matches as the guesses);
- `TreeDraftModel`: a draft model grows the tree best first by its own path probability, as
  EAGLE-2 does (Li et al. 2024): `width` children (its top-k, or k independent draws when
  sampling) at the first `branch_depth` levels, one child below; Medusa's static top-k trees
  (Cai et al. 2024) are the fixed-shape relative;
- `ChainTree`: any chain drafter (`propose`) as a one-branch tree.
"""
from __future__ import annotations

import heapq

import torch

from labkit import checks
from labkit.sampling import SamplingParams, process_logits
from labkit.speculative.drafters import DraftModel, PromptLookup
from labkit.speculative.tree import TokenTree

__all__ = ["TreeLookup", "TreeDraftModel", "ChainTree"]


class TreeLookup:
    """Continuations of the latest `branches` matches of the history's suffix (n = max_ngram..min_ngram).

    Branch r (0 = the match `PromptLookup` would take) weighs `decay`**r, and a node at depth d
    `depth_decay`**d more; the budget goes to the nodes of most value (`TokenTree.from_branches`).
    With the defaults branch 0 outweighs all the others together, so the tree holds the chain
    `PromptLookup` would propose and greedy verification never accepts fewer tokens than the
    chain; the other matches get the nodes the latest one leaves (a continuation that runs into
    the end of the history). A `depth_decay` below 1 trades depth on the latest match for the
    first tokens of the others.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, branches: int = 4, decay: float = 0.5,
                 depth_decay: float = 1.0):
        checks.positive_int("branches", branches)
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.lookup = PromptLookup(max_ngram, min_ngram)
        if not 0 < depth_decay <= 1:
            raise ValueError(f"depth_decay must be in (0, 1], got {depth_decay!r}")
        self.branches, self.decay, self.depth_decay = branches, decay, depth_decay
        self.steps = 0

    def propose_tree(self, history: list[int], max_nodes: int, params: SamplingParams | None = None,
                     generator=None) -> TokenTree:
        checks.positive_int("max_nodes", max_nodes, why="the root counts")
        ends: list[int] = []
        for end in self.lookup.matches(history):
            if end not in ends:  # a match of n tokens also ends where the match of its last n-1 ends
                ends.append(end)
                if len(ends) == self.branches:
                    break
        branches = [history[e:e + max_nodes - 1] for e in ends]
        weights = [self.decay ** r for r in range(len(ends))]
        return TokenTree.from_branches(history[-1], branches, max_nodes, weights, self.depth_decay)


class TreeDraftModel:
    """A draft model (the target's vocabulary, its own KV cache) growing the tree best first by path probability."""

    def __init__(self, model, width: int = 2, branch_depth: int = 1, max_len: int | None = None):
        checks.positive_int("width", width)
        checks.integer("branch_depth", branch_depth, 0)
        self.draft = DraftModel(model, max_len)
        self.model, self.width, self.branch_depth = model, width, branch_depth

    @property
    def steps(self) -> int:
        return self.draft.steps

    def propose_tree(self, history: list[int], max_nodes: int, params: SamplingParams | None = None,
                     generator=None) -> TokenTree:
        checks.positive_int("max_nodes", max_nodes, why="the root counts")
        params = params or SamplingParams()
        tree = TokenTree(history[-1])
        frontier = [(-1.0, 0)]  # (−path probability, node): the most probable node is expanded first
        while frontier and len(tree) < max_nodes:
            value, node = heapq.heappop(frontier)
            seq = history + tree.path_tokens(node)
            logits = self.draft._logits_after(seq)  # one draft forward; its cache keeps the shared prefix
            k = min(self.width if tree.depths[node] < self.branch_depth else 1, max_nodes - len(tree))
            for child, prob in self._children(tree, node, logits, seq, k, params, generator):
                heapq.heappush(frontier, (value * prob, child))
        return tree

    @staticmethod
    def _children(tree, node, logits, seq, k, params, generator):
        """Add k children below `node`: the top k when greedy, k draws from q otherwise; yield (new child, q(x))."""
        if params.greedy:
            probs = torch.softmax(logits, -1)
            picks = torch.topk(probs, k).indices.tolist()
            new = [(tree.add(node, x), float(probs[x])) for x in picks]
        else:
            probs = torch.softmax(process_logits(logits, seq, params), -1)
            picks = torch.multinomial(probs, k, replacement=True, generator=generator).tolist()
            before = len(tree)
            new = [(tree.add_draw(node, x, probs), float(probs[x])) for x in picks]
            new = [(c, p) for c, p in new if c >= before]
        return list(dict(new).items())  # a repeated draw adds no second child


class ChainTree:
    """A chain drafter (`propose(history, gamma, params, generator)`) as a tree with one branch."""

    def __init__(self, drafter):
        self.drafter = drafter

    @property
    def steps(self) -> int:
        return getattr(self.drafter, "steps", 0)

    def attach(self, cache) -> None:
        if hasattr(self.drafter, "attach"):
            self.drafter.attach(cache)

    def propose_tree(self, history: list[int], max_nodes: int, params: SamplingParams | None = None,
                     generator=None) -> TokenTree:
        checks.positive_int("max_nodes", max_nodes, why="the root counts")
        tree, node = TokenTree(history[-1]), 0
        if max_nodes > 1:
            tokens, q = self.drafter.propose(history, max_nodes - 1, params or SamplingParams(), generator)
            for i, x in enumerate(tokens):
                node = tree.add(node, x) if q is None else tree.add_draw(node, x, q[i])
        return tree
