"""Tree speculative decoding: the target verifies a whole token tree in one forward pass.

    out = labkit.speculative.generate_tree(target, TreeLookup(), tok, prompt, max_nodes=8)
    out.text, out.accepted_per_pass, out.tokens_per_call, out.plain   # plain: with compare=True

Each pass (SpecInfer, Miao et al. 2024): the drafter proposes a tree of at most `max_nodes`
nodes below the last emitted token (`labkit.speculative.treedraft`); the target runs one
forward over all of them on its own KV cache, each node at position prefix + depth and
seeing only the prefix, its ancestors and itself (`TreeCache`); verification
(`labkit.speculative.tree`) accepts one root-to-node path and adds one token of the target's
own. Rollback: the cache keeps the prefix and the accepted path's slots, moved to consecutive
slots (`KVCache.compact`), and drops the rejected branches. A pass therefore emits between 1
and depth + 1 tokens.

The model is not changed: `TreeCache` is a thin view of the real cache that hands the model
the tree's positions from `begin` and the tree mask from `update`. Both ways the model attends
go through `update`: `cache.attend`, which the view inherits from `KVCache` (update, then
attention with the mask it returned), and the batch-invariant path (`kernels.attend_rows`),
which `generate_tree` turns on by default: each node attends alone over the keys its row of the
tree mask lets it see, so it gets the bits a one-token step on its own path gets, and greedy
tree output equals plain greedy output on every format. The view reports no kind, so no
kind-specific shortcut takes it for a contiguous cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from labkit import checks
from labkit.measure.clock import now as clock_now
from labkit.kvcache.base import KVCache
from labkit.sampling import SamplingParams, make_generator, process_logits, sample_next
from labkit.quant.rows import INVARIANT_MAX_ROWS
from labkit.speculative.decode import SpeculativeOutput, emitted, run_exact
from labkit.speculative.tree import TokenTree, verify_greedy, verify_sampled
from labkit.speculative.treedraft import ChainTree, TreeDraftModel

__all__ = ["TreeCache", "tree_logits", "verify_tree", "generate_tree", "TreeOutput"]


class TreeCache(KVCache):
    """One tree pass over `cache`: `begin` returns the tree's positions, `update` the tree mask.

    The keys and values go where the real cache puts them (slots seq_len .. seq_len + n − 1,
    rotated at the tree positions); `end` commits all n, and `commit_path` keeps the accepted ones.
    """

    def __init__(self, cache: KVCache, tree: TokenTree):  # no KVCache.__init__: the state is `cache`'s
        check_cache(cache)
        self.cache, self.n = cache, len(tree)
        prefix = cache.seq_len
        self.positions_in_pass = tree.positions(prefix).to(cache.device)
        self.mask = None if self.n == 1 else tree.mask(prefix).to(cache.device)

    config = property(lambda self: self.cache.config)
    batch_size = property(lambda self: self.cache.batch_size)
    max_len = property(lambda self: self.cache.max_len)
    device = property(lambda self: self.cache.device)
    dtype = property(lambda self: self.cache.dtype)
    pass_end = property(lambda self: self.cache.pass_end)  # the last slot written: what the context check reads
    seq_len = property(lambda self: self.cache.seq_len)

    def begin(self, n_new: int) -> torch.Tensor:
        if n_new != self.n:
            raise ValueError(f"a tree pass feeds all {self.n} nodes at once, got n_new={n_new}")
        self.cache.begin(n_new)
        return self.positions_in_pass

    def update(self, layer, k, v, rope):
        keys, values, _ = self.cache.update(layer, k, v, rope)  # the real cache's causal mask is for a chain
        return keys, values, self.mask

    def end(self) -> None:
        self.cache.end()

    def abort(self) -> None:
        self.cache.abort()

    def reset(self) -> None:
        self.cache.reset()

    def bytes_allocated(self) -> int:
        return self.cache.bytes_allocated()

    def bytes_used(self) -> int:
        return self.cache.bytes_used()


def check_cache(cache) -> None:
    """ValueError unless `cache` can run a tree pass: keys rotated by the model, one sequence a row, `compact`."""
    if not isinstance(cache, KVCache) or isinstance(cache, TreeCache):
        raise ValueError(f"cache must be a labkit KV cache, got {type(cache).__name__}")
    if not (cache.supports("compact") and cache.rotate_new_keys and not cache.packed):
        raise ValueError(f"cache: tree verification needs a cache that keeps a chosen subset of its tokens "
                         f"(compact) and stores keys rotated at their positions; a {cache.kind or type(cache).__name__} "
                         "cache does not (use the contiguous cache)")


def tree_logits(target, cache: KVCache, tree: TokenTree) -> torch.Tensor:
    """One target forward over every node of `tree` after what `cache` holds: float logits [n, V].

    The cache then holds the prefix and all n nodes; `commit_path` keeps the accepted path.
    """
    if not isinstance(tree, TokenTree):
        raise ValueError(f"tree must be a TokenTree, got {type(tree).__name__}")
    tree.check(target.config.vocab_size)
    ids = torch.tensor([tree.tokens], device=target.device)
    return target(ids, cache=TreeCache(cache, tree))[0].float()


def commit_path(cache: KVCache, prefix_len: int, path: list[int]) -> None:
    """Keep the prefix and the nodes of `path` (root first), moved to consecutive slots; drop the other nodes."""
    cache.compact(prefix_len, [prefix_len + node for node in path])


def verify_tree(target, cache: KVCache, tree: TokenTree, history: list[int], params: SamplingParams | None = None,
                generator=None) -> tuple[list[int], int]:
    """Run the tree pass, verify, roll the cache back: (accepted path: nodes from the root, next token).

    `history` ends with the root's token and the cache holds all of it but that token. After
    the call the cache holds the history and the accepted tokens (not the next token).
    """
    params = params or SamplingParams()
    prefix = cache.seq_len
    if not history or prefix != len(history) - 1 or tree.tokens[0] != history[-1]:
        raise ValueError(f"history must end with the tree's root ({tree.tokens[0]}) and hold one token more than the "
                         f"cache ({prefix}); got {len(history)} tokens ending with {history[-1:]}")
    logits = tree_logits(target, cache, tree)
    if params.plain_greedy:
        path, nxt = verify_greedy(tree, logits.argmax(-1).tolist())
    else:  # the sampler pipeline at every node, with the history that node continues
        processed = process_logits(logits, [history + tree.path_tokens(i) for i in range(len(tree))], params)
        path, nxt = (verify_greedy(tree, processed.argmax(-1).tolist()) if params.greedy
                     else verify_sampled(tree, torch.softmax(processed, -1), generator))
    commit_path(cache, prefix, path)
    return path, nxt


@dataclass
class TreeOutput(SpeculativeOutput):
    """`SpeculativeOutput` of a tree run: `gammas` holds the draft nodes of each pass."""

    accepted_per_pass: list[int] = field(default_factory=list)  # draft tokens accepted by each verification pass


def as_tree_drafter(drafter):
    """A tree drafter (`propose_tree`), a chain drafter (`propose`, as one branch) or a draft model."""
    if hasattr(drafter, "propose_tree"):
        return drafter
    if hasattr(drafter, "propose"):
        return ChainTree(drafter)
    if hasattr(drafter, "new_cache") and hasattr(drafter, "config"):
        return TreeDraftModel(drafter)
    raise TypeError(f"drafter must be a tree drafter (TreeLookup(), TreeDraftModel(model)), a chain drafter or a "
                    f"draft model, got {type(drafter).__name__}")


def _check(target, drafter, max_nodes, max_new_tokens, sampling) -> None:
    checks.positive_int("max_nodes", max_nodes, why="tree nodes verified per pass, the root counts")
    checks.positive_int("max_new_tokens", max_new_tokens)
    constrained = sorted({"regex", "json_schema", "choices"} & set(sampling))
    if constrained:
        raise ValueError(f"tree speculation does not honour constraints ({', '.join(constrained)}); "
                         "use labkit.generate for constrained decoding")
    dm = getattr(drafter, "model", None) or getattr(getattr(drafter, "drafter", None), "model", None)
    if dm is not None and hasattr(dm, "config") and dm.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"drafter: the draft's vocabulary ({dm.config.vocab_size}) differs from the target's "
                         f"({target.config.vocab_size})")


@torch.inference_mode()
def generate_tree(target, drafter, tok, prompt, *, max_nodes: int = 8, max_new_tokens: int = 64, seed: int | None = 0,
                  chat: bool | None = None, compare: bool = False, batch_invariant: bool = True, **sampling) -> TreeOutput:
    """Generate with tree speculative decoding: at most `max_nodes` tree nodes (root included) per target pass.

    `batch_invariant` (default on), as in `speculative.generate`: the tree passes give each node the bits a
    one-token step on its path gives it, so greedy output cannot depend on the tree's shape. The mode covers
    passes of up to `INVARIANT_MAX_ROWS` (16) tokens, so with it `max_nodes` may be at most 16."""
    if batch_invariant is True and isinstance(max_nodes, int) and max_nodes > INVARIANT_MAX_ROWS:
        raise ValueError(f"max_nodes must be at most {INVARIANT_MAX_ROWS} with batch_invariant=True (passes of up to "
                         f"{INVARIANT_MAX_ROWS} tokens are row-invariant), got {max_nodes!r}; pass "
                         "batch_invariant=False for larger trees")
    return run_exact(target, batch_invariant, lambda: _generate_tree(target, drafter, tok, prompt, max_nodes,
                                                                     max_new_tokens, seed, chat, sampling),
                     compare and (tok, max_new_tokens, seed, sampling))


def _generate_tree(target, drafter, tok, prompt, max_nodes, max_new_tokens, seed, chat, sampling) -> TreeOutput:
    from labkit.generation.reply import encode_prompt

    drafter = as_tree_drafter(drafter)
    _check(target, drafter, max_nodes, max_new_tokens, sampling)
    params = SamplingParams.from_kwargs(None, **sampling)
    ids = encode_prompt(tok, prompt, chat)
    eos = getattr(tok, "eos_id", None)
    t0 = clock_now()
    gen = make_generator(seed) if not params.greedy else None
    cache = target.new_cache(max_len=min(target.config.max_seq_len, len(ids) + max_new_tokens + max_nodes + 1))
    if hasattr(drafter, "attach"):
        drafter.attach(cache)
    logits = target(torch.tensor([ids], device=target.device), cache=cache, last_only=True)[0, -1].float()
    first = sample_next(logits, ids, params, gen)
    prefill_s = clock_now() - t0
    history, out = ids + [first], [first]
    proposed, accepted, nodes, per_pass, calls, tested = [0] * max_nodes, [0] * max_nodes, [], [], 1, 0
    while len(out) < max_new_tokens and out[-1] != eos:
        budget = min(max_nodes, max_new_tokens - len(out), cache.max_len - cache.seq_len)
        if budget < 1:
            break
        tree = drafter.propose_tree(history, budget, params, gen)
        if len(tree) > budget or tree.tokens[0] != history[-1]:
            raise ValueError(f"drafter returned a tree of {len(tree)} nodes rooted at {tree.tokens[0]}; expected at "
                             f"most {budget} nodes rooted at the last token {history[-1]}")
        path, nxt = verify_tree(target, cache, tree, history, params, gen)
        calls += 1
        k = len(path) - 1
        for d in range(tree.depth):
            proposed[d] += 1
            accepted[d] += d < k
        tested += k + bool(tree.draws[path[-1]])
        nodes.append(len(tree) - 1)
        per_pass.append(k)
        new = [tree.tokens[i] for i in path[1:]] + [nxt]
        new = emitted(new, eos, max_new_tokens - len(out))
        history += new
        out += new
    wall = clock_now() - t0
    depth = max((d + 1 for d, n in enumerate(proposed) if n), default=0)
    result = TreeOutput(
        text=tok.decode([i for i in out if i != eos]), token_ids=out, prompt_ids=ids,
        acceptance=[accepted[d] / proposed[d] for d in range(depth)], proposed=proposed[:depth], gammas=nodes,
        target_calls=calls, draft_steps=getattr(drafter, "steps", 0), wall_s=wall, tested=tested,
        accepted=sum(per_pass), prefill_s=prefill_s, accepted_per_pass=per_pass)
    return result
