"""Token trees: several drafted continuations, verified together in one target pass.

SpecInfer (Miao et al. 2024, "SpecInfer: Accelerating Large Language Model Serving with Tree-based
Speculative Inference and Verification") merges many guesses into one token tree; Medusa (Cai et al.
2024) builds a static tree from top-k heads; EAGLE-2 (Li et al. 2024) grows a dynamic tree from the
draft's confidence. A chain of γ drafts is the special case with one branch.

Node 0 is the root: the last emitted token, which the target has not seen yet. Every other
node is one drafted token below its parent, and nodes are numbered parents first, so a node's
path (root → node) reads as a continuation of the history. The target sees all nodes in one
pass: node i sits at position prefix_len + depth(i) and attends to every prefix token and to
exactly its own ancestors and itself (`TokenTree.mask`); its logits are then those of its path
alone (the sibling branches are invisible to it).

Verification walks down from the root:

- greedy (`verify_greedy`): follow the child whose token is the target's argmax at the
  current node; at a node where no child matches, the argmax itself is the bonus token. The
  output is token for token the target's greedy output;
- sampled (`verify_sampled`, SpecInfer's multi-step speculative sampling): the children of a
  node were drawn independently from the draft's q there. Try them in the order drawn: accept
  x with probability min(1, p(x)/q(x)); on a rejection p ← norm(max(0, p − q)) and try the
  next; when every draw is rejected, draw the token from what p has become. A node whose
  children were chosen deterministically (prompt lookup: distinct tokens) has q = one-hot per
  child: accept x with probability p(x), else p(x) ← 0 and renormalise. Either way every
  emitted token is distributed exactly as the target samples it.

    >>> tree = TokenTree.from_branches(7, [[1, 2], [1, 3], [4]])
    >>> tree.tokens, tree.parents, tree.depths
    ([7, 1, 2, 3, 4], [-1, 0, 1, 1, 0], [0, 1, 2, 2, 1])
    >>> verify_greedy(tree, [1, 3, 0, 5, 0])     # the target's argmax: 1 at the root, 3 below it, then 5
    ([0, 1, 3], 5)
"""
from __future__ import annotations

import torch

from labkit import checks
from labkit.speculative.verify import residual

__all__ = ["TokenTree", "verify_greedy", "verify_sampled"]


class TokenTree:
    """A trie of drafted tokens below a root; nodes in topological order (parents first)."""

    def __init__(self, root: int):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.q: list[torch.Tensor | None] = []  # per node: the draft distribution its children were drawn from
        self.draws: list[list[int]] = []  # per node: its children in the order verification tries them
        self._child: list[dict[int, int]] = []  # per node: token -> child node
        self._new(_token(root, "root"), -1)

    def _new(self, token: int, parent: int) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        self.q.append(None)
        self.draws.append([])
        self._child.append({})
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"TokenTree(tokens={self.tokens}, parents={self.parents})"

    @property
    def depth(self) -> int:
        """The deepest node's depth: the most draft tokens one pass can accept."""
        return max(self.depths)

    def children(self, node: int) -> list[int]:
        """The distinct children of `node`, in the order they were added."""
        return list(self._child[node].values())

    def add(self, parent: int, token: int) -> int:
        """The child of `parent` holding `token` (a deterministic proposal), added if new."""
        self._check_node(parent, "parent")
        if self.q[parent] is not None:
            raise ValueError(f"node {parent}'s children were drawn from a q; add them with add_draw")
        token = _token(token, "token")
        if token not in self._child[parent]:
            self._child[parent][token] = self._new(token, parent)
            self.draws[parent].append(self._child[parent][token])
        return self._child[parent][token]

    def add_draw(self, parent: int, token: int, q: torch.Tensor) -> int:
        """Record `token` drawn from the draft distribution `q` [V] at `parent`; repeated draws are tried again."""
        self._check_node(parent, "parent")
        if self.q[parent] is None and self.draws[parent]:
            raise ValueError(f"node {parent} already has deterministic children; draws need one q per node")
        if self.q[parent] is not None and self.q[parent] is not q and not torch.equal(self.q[parent], q):
            raise ValueError(f"node {parent}'s children must all be drawn from the same q")
        self.q[parent] = q
        token = _token(token, "token")
        if token not in self._child[parent]:
            self._child[parent][token] = self._new(token, parent)
        self.draws[parent].append(self._child[parent][token])
        return self._child[parent][token]

    @classmethod
    def from_parents(cls, tokens, parents) -> "TokenTree":
        """A tree from its node list: `parents[i]` < i, and -1 for the root (node 0) only."""
        tokens, parents = list(tokens), list(parents)
        if not tokens:
            raise ValueError("tokens must hold at least the root (node 0); got an empty tree")
        if len(parents) != len(tokens) or parents[0] != -1:
            raise ValueError(f"parents must have one entry per token ({len(tokens)}) with parents[0] == -1, "
                             f"got {parents}")
        tree = cls(tokens[0])
        for i in range(1, len(tokens)):
            if not isinstance(parents[i], int) or not 0 <= parents[i] < len(tree):
                raise ValueError(f"parents[{i}] must name an earlier node in [0, {i}), got {parents[i]!r}")
            if tree.add(parents[i], tokens[i]) != i:
                raise ValueError(f"node {i} repeats token {tokens[i]} under node {parents[i]}: a trie holds it once")
        return tree

    @classmethod
    def from_branches(cls, root: int, branches, max_nodes: int | None = None, weights=None,
                      depth_decay: float = 1.0) -> "TokenTree":
        """The trie of `branches` (token lists below `root`), cut to its best `max_nodes` nodes (root included).

        A node's value is the summed weight of the branches through it (default weight 1: how
        many branches agree so far) times depth_decay**depth, so it never grows down a path. The
        best nodes by (value, then shallower, then earlier) therefore always form a tree: EAGLE-2's
        rerank of the draft tree by confidence, with branch agreement as the confidence.
        """
        checks.positive_int("max_nodes", max_nodes, why="the root counts", none_ok=True)
        branches = [list(b) for b in branches]
        weights = [1.0] * len(branches) if weights is None else [float(w) for w in weights]
        if len(weights) != len(branches) or any(w < 0 for w in weights):
            raise ValueError(f"weights must be one non-negative number per branch ({len(branches)}), got {weights}")
        if not 0 < depth_decay <= 1:
            raise ValueError(f"depth_decay must be in (0, 1], got {depth_decay!r}")
        full, value = cls(root), [0.0]
        for branch, w in zip(branches, weights):
            node = 0
            for t in branch:
                node = full.add(node, t)
                value += [0.0] * (len(full) - len(value))
                value[node] += w
        if max_nodes is None or len(full) <= max_nodes:
            return full
        value = [v * depth_decay ** d for v, d in zip(value, full.depths)]
        best = sorted(range(1, len(full)), key=lambda i: (-value[i], full.depths[i], i))[:max_nodes - 1]
        return full.subtree(sorted(best))

    def subtree(self, nodes) -> "TokenTree":
        """The tree of the root and `nodes` (increasing; each one's parent among them), with q and draws kept."""
        keep = {0: 0}
        out = TokenTree(self.tokens[0])
        for i in nodes:
            if self.parents[i] not in keep:
                raise ValueError(f"node {i}'s parent {self.parents[i]} is not kept: the nodes do not form a tree")
            keep[i] = out._new(self.tokens[i], keep[self.parents[i]])
            out._child[keep[self.parents[i]]][self.tokens[i]] = keep[i]
        for old, new in keep.items():
            out.q[new] = self.q[old]
            out.draws[new] = [keep[c] for c in self.draws[old] if c in keep]
        return out

    def path(self, node: int) -> list[int]:
        """The nodes from the root down to `node`."""
        self._check_node(node, "node")
        out = [node]
        while self.parents[out[-1]] >= 0:
            out.append(self.parents[out[-1]])
        return out[::-1]

    def path_tokens(self, node: int) -> list[int]:
        """The drafted tokens from below the root down to `node` (what node's logits continue)."""
        return [self.tokens[i] for i in self.path(node)[1:]]

    def positions(self, prefix_len: int) -> torch.Tensor:
        """RoPE positions of the nodes, prefix_len + depth: LongTensor [n]."""
        return prefix_len + torch.tensor(self.depths, dtype=torch.long)

    def ancestors(self) -> torch.Tensor:
        """bool [n, n]: entry (i, j) is True when node j is node i or one of its ancestors."""
        n = len(self)
        seen = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            seen[i] |= seen[self.parents[i]]
        return seen

    def mask(self, prefix_len: int) -> torch.Tensor:
        """The tree attention mask, bool [n, prefix_len + n]: every prefix token, then ancestors and self."""
        return torch.cat([torch.ones(len(self), prefix_len, dtype=torch.bool), self.ancestors()], dim=1)

    def check(self, vocab_size: int) -> None:
        """ValueError naming the node when a branch holds a token outside [0, vocab_size)."""
        for i, t in enumerate(self.tokens):
            if not 0 <= t < vocab_size:
                raise ValueError(f"branch token {t} (node {i}) is outside the vocabulary [0, {vocab_size})")

    def _check_node(self, node, what: str) -> None:
        if not isinstance(node, int) or not 0 <= node < len(self):
            raise ValueError(f"{what} must be a node in [0, {len(self)}), got {node!r}")


def _token(t, what: str) -> int:
    if isinstance(t, torch.Tensor) and t.numel() == 1:
        t = t.item()
    if not checks.is_int(t) or t < 0:
        raise ValueError(f"{what} must be a token id (an integer >= 0), got {t!r}")
    return t


def _check_rows(tree: TokenTree, rows, what: str) -> None:
    if len(rows) != len(tree):
        raise ValueError(f"{what} must have one row per tree node ({len(tree)}), got {len(rows)}")


def verify_greedy(tree: TokenTree, best) -> tuple[list[int], int]:
    """(accepted path: node indices from the root, the bonus token) for `best[i]`: the target's argmax at node i."""
    _check_rows(tree, best, "best")
    path = [0]
    while True:
        token = int(best[path[-1]])
        child = tree._child[path[-1]].get(token)
        if child is None:
            return path, token
        path.append(child)


def verify_sampled(tree: TokenTree, probs: torch.Tensor, generator: torch.Generator | None = None
                   ) -> tuple[list[int], int]:
    """(accepted path, the next token) by SpecInfer's multi-step speculative sampling; probs [n, V]: the target's."""
    _check_rows(tree, probs, "probs")
    path = [0]
    while True:
        node, p, q = path[-1], probs[path[-1]], tree.q[path[-1]]
        for child in tree.draws[node]:
            x = tree.tokens[child]
            qx = 1.0 if q is None else float(q[x])
            u = float(torch.rand((), generator=generator))
            if qx > 0 and u < min(1.0, float(p[x]) / qx):
                path.append(child)
                break
            p = residual(p, torch.nn.functional.one_hot(torch.tensor(x), p.shape[-1]).to(p.dtype) if q is None else q)
        else:
            return path, int(torch.multinomial(p, 1, generator=generator))
