"""Tree speculative decoding: the tree pass sees each path alone, rolls back exactly, is greedy-exact and exact in law."""
import pytest
import torch

from labkit import kvcache
from labkit.speculative import (LayerSkip, PromptLookup, TokenTree, TreeCache, TreeDraftModel, TreeLookup,
                                generate_tree, tree_logits, verify_greedy, verify_sampled, verify_tree)
from labkit.speculative.verify import residual
from tests.kvcache_shared import ids, tiny

from tests.test_speculative import CHI2_999, _chi2  # the χ² statistic and its 0.999 quantile


# ---- the tree ---------------------------------------------------------------------------

def test_mask_and_positions_of_a_hand_built_tree():
    #        9            root, depth 0
    #      /   \
    #     4     5         depth 1
    #    / \     \
    #   6   7     8       depth 2
    tree = TokenTree.from_parents([9, 4, 5, 6, 7, 8], [-1, 0, 0, 1, 1, 2])
    assert tree.positions(3).tolist() == [3, 4, 4, 5, 5, 5]
    assert tree.depth == 2 and tree.children(1) == [3, 4] and tree.path(5) == [0, 2, 5] and tree.path_tokens(4) == [4, 7]
    P = [1, 1, 1]  # the 3 prefix tokens: every node sees them
    assert tree.mask(3).int().tolist() == [
        P + [1, 0, 0, 0, 0, 0],
        P + [1, 1, 0, 0, 0, 0],
        P + [1, 0, 1, 0, 0, 0],
        P + [1, 1, 0, 1, 0, 0],
        P + [1, 1, 0, 0, 1, 0],
        P + [1, 0, 1, 0, 0, 1],
    ]


def test_branches_merge_into_a_trie_cut_to_the_budget():
    tree = TokenTree.from_branches(0, [[1, 2, 3], [1, 2, 4], [5]])
    assert tree.tokens == [0, 1, 2, 3, 4, 5] and tree.parents == [-1, 0, 1, 2, 2, 0]
    cut = TokenTree.from_branches(0, [[1, 2, 3], [1, 2, 4], [5]], max_nodes=4)  # the shared 1, 2 first, then depth
    assert cut.tokens == [0, 1, 2, 5] and cut.parents == [-1, 0, 1, 0]
    weighted = TokenTree.from_branches(0, [[1, 2, 3], [5, 6]], max_nodes=4, weights=[1.0, 0.5])
    assert weighted.tokens == [0, 1, 2, 3]  # the heavier branch takes the budget
    assert len(TokenTree.from_branches(0, [], max_nodes=3)) == 1


def test_bad_trees_and_budgets_name_the_parameter():
    with pytest.raises(ValueError, match="empty tree"):
        TokenTree.from_parents([], [])
    with pytest.raises(ValueError, match=r"parents\[2\]"):
        TokenTree.from_parents([0, 1, 2], [-1, 0, 5])
    with pytest.raises(ValueError, match="max_nodes must be None or a positive integer"):
        TokenTree.from_branches(0, [[1]], max_nodes=0)
    with pytest.raises(ValueError, match="max_nodes must be a positive integer"):
        TreeLookup().propose_tree([1, 2, 1], 0)
    with pytest.raises(ValueError, match="token must be a token id"):
        TokenTree.from_branches(0, [[1, -3]])
    with pytest.raises(ValueError, match="same q"):
        tree = TokenTree(0)
        tree.add_draw(0, 1, torch.full((4,), 0.25))
        tree.add_draw(0, 2, torch.tensor([0.1, 0.2, 0.3, 0.4]))
    with pytest.raises(ValueError, match="best must have one row per tree node"):
        verify_greedy(TokenTree.from_branches(0, [[1]]), [1])


# ---- the tree pass on a model's cache ------------------------------------------------------

def _prefilled(model, history):
    cache = model.new_cache(max_len=64)
    with torch.inference_mode():
        model(torch.tensor([history[:-1]]), cache=cache)
    return cache


@torch.inference_mode()
def _greedy_continuation(model, history, n):
    seq = list(history)
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(history):]


@pytest.mark.parametrize("invariant", [False, True])  # True: the attention path that splits a pass by query
def test_a_tree_pass_gives_each_node_the_logits_of_its_path_alone(invariant):
    model, history = tiny(), ids(7)[0].tolist()
    model.batch_invariant = invariant
    for branches in ([[3, 4, 5], [3, 6], [7, 8, 9, 10], [11]], [[3, 4, 5]]):  # a tree, and a chain (a causal mask)
        tree = TokenTree.from_branches(history[-1], branches)
        cache = _prefilled(model, history)
        with torch.inference_mode():
            logits = tree_logits(model, cache, tree)
            assert cache.seq_len == len(history) - 1 + len(tree)
            for i in range(len(tree)):
                alone = model(torch.tensor([history + tree.path_tokens(i)]))[0, -1]
                torch.testing.assert_close(logits[i], alone, rtol=1e-5, atol=1e-5)


def test_rollback_leaves_the_cache_of_a_fresh_prefill_of_the_accepted_path():
    model, history = tiny(), ids(7)[0].tolist()
    good = _greedy_continuation(model, history, 4)
    # the target's own continuation sits after a decoy branch, so its nodes are not contiguous slots
    decoy = [(good[0] + 1) % 61, 5, 6]
    tree = TokenTree.from_branches(history[-1], [decoy, [good[0], 9, 9], good[:3], [good[0], good[1], 2]])
    cache = _prefilled(model, history)
    with torch.inference_mode():
        path, nxt = verify_tree(model, cache, tree, history)
        assert [tree.tokens[i] for i in path[1:]] == good[:3] and nxt == good[3]
        assert path != list(range(len(path)))  # the accepted slots had to move
        kept = history + good[:3]
        assert cache.seq_len == len(kept)
        fresh = _prefilled(model, kept + [nxt])
        n = len(kept)
        torch.testing.assert_close(cache.keys[:, :, :, :n], fresh.keys[:, :, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.values[:, :, :, :n], fresh.values[:, :, :, :n], rtol=1e-5, atol=1e-5)
        step = model(torch.tensor([[nxt]]), cache=cache)[0, -1]
        torch.testing.assert_close(step, model(torch.tensor([kept + [nxt]]))[0, -1], rtol=1e-5, atol=1e-5)


def test_compact_is_an_optional_capability_of_the_contiguous_cache():
    kvcache.kinds()
    kinds = kvcache.base.KINDS
    assert kinds["contiguous"].supports("compact")
    assert not any(kinds[k].supports("compact") for k in ("sliding", "paged", "quantized"))
    cfg = tiny().config
    cache = kvcache.new_cache("contiguous", cfg, max_len=8)
    cache.begin(5)
    cache.end()
    with pytest.raises(ValueError, match="slots must increase"):
        cache.compact(2, [4, 3])
    with pytest.raises(ValueError, match="slots must increase"):
        cache.compact(2, [1])
    with pytest.raises(NotImplementedError, match="compact"):
        kvcache.new_cache("sliding", cfg, window=8).compact(0, [])
    with pytest.raises(ValueError, match="cache: tree verification needs"):
        TreeCache(kvcache.new_cache("sliding", cfg, window=8), TokenTree(1))


def test_a_token_outside_the_vocabulary_is_refused_before_the_pass():
    model, history = tiny(), ids(5)[0].tolist()
    cache = _prefilled(model, history)
    with pytest.raises(ValueError, match="branch token 99 .* outside the vocabulary"):
        tree_logits(model, cache, TokenTree.from_branches(history[-1], [[1, 99]]))
    assert cache.seq_len == len(history) - 1  # nothing was written


# ---- whole generations ----------------------------------------------------------------

from tests.test_speculative import pair  # noqa: E402,F401 - the target, its noisy draft and their tokenizer


@pytest.mark.parametrize("drafter", ["lookup", "model", "chain", "layerskip"])
@pytest.mark.parametrize("max_nodes", [1, 4, 9])
def test_greedy_tree_speculation_is_token_for_token_the_target(pair, drafter, max_nodes):
    target, draft, tok = pair
    prompts = ["the cat sat on the mat and the dog", "the log. the dog sat on the mat and"]
    for prompt in prompts:
        d = {"lookup": lambda: TreeLookup(branches=3), "model": lambda: TreeDraftModel(draft, width=2, branch_depth=2),
             "chain": lambda: PromptLookup(), "layerskip": lambda: LayerSkip(target, 1)}[drafter]()
        out = generate_tree(target, d, tok, prompt, max_nodes=max_nodes, max_new_tokens=30, compare=True, chat=False)
        assert out.plain["same_tokens"], (prompt, out.token_ids, out.plain["token_ids"])
        assert len(out.accepted_per_pass) == out.target_calls - 1 == len(out.gammas)
        assert max(out.gammas) <= max_nodes - 1 and sum(out.accepted_per_pass) == out.accepted


class _Oracle:
    """Knows the target's greedy continuation and hides it among decoys: every pass should accept deep."""

    def __init__(self, target):
        self.target = target

    def propose_tree(self, history, max_nodes, params=None, generator=None):
        good = _greedy_continuation(self.target, history, 3)
        decoys = [[(good[0] + 1) % 61, 1], [good[0], (good[1] + 1) % 61], [good[0], good[1], (good[2] + 1) % 61]]
        return TokenTree.from_branches(history[-1], decoys + [good], max_nodes)


def test_deep_acceptance_over_many_passes_keeps_the_greedy_output(pair):
    target, _, tok = pair
    out = generate_tree(target, _Oracle(target), tok, "the cat sat", max_nodes=8, max_new_tokens=30, compare=True,
                        chat=False)
    assert out.plain["same_tokens"] and out.accepted_per_pass[:5] == [3] * 5


def test_greedy_with_a_penalty_is_still_the_target(pair):
    target, draft, tok = pair
    out = generate_tree(target, TreeDraftModel(draft), tok, "the cat sat", max_nodes=6, max_new_tokens=20,
                        compare=True, chat=False, repetition_penalty=1.3)
    assert out.plain["same_tokens"]


def test_sampled_tree_speculation_is_seeded(pair):
    target, draft, tok = pair
    runs = [generate_tree(target, TreeDraftModel(draft), tok, "the cat", max_nodes=6, max_new_tokens=20, seed=s,
                          chat=False, temperature=1.0, top_k=20).token_ids for s in (3, 3, 4)]
    assert runs[0] == runs[1] and len(runs[0]) == 20
    lookup = generate_tree(target, TreeLookup(), tok, "the cat sat on the mat and the cat", max_nodes=6,
                           max_new_tokens=20, chat=False, temperature=0.8)  # deterministic proposals, sampled
    assert len(lookup.token_ids) == 20 and lookup.prefill_s > 0


def test_bad_arguments_name_the_parameter(pair):
    target, draft, tok = pair
    with pytest.raises(ValueError, match="max_nodes must be a positive integer"):
        generate_tree(target, TreeLookup(), tok, "the cat", max_nodes=0)
    with pytest.raises(ValueError, match="max_new_tokens must be"):
        generate_tree(target, TreeLookup(), tok, "the cat", max_new_tokens=0)
    with pytest.raises(ValueError, match="does not honour constraints"):
        generate_tree(target, TreeLookup(), tok, "the cat", regex="a+")
    with pytest.raises(ValueError, match="branches must be"):
        TreeLookup(branches=0)
    with pytest.raises(TypeError, match="drafter must be"):
        generate_tree(target, object(), tok, "the cat")
    other = tiny(vocab_size=tok.vocab_size + 1)
    with pytest.raises(ValueError, match="drafter: the draft's vocabulary"):
        generate_tree(target, TreeDraftModel(other), tok, "the cat")


# ---- exactness in distribution (SpecInfer's multi-step speculative sampling) ------------

def _toy(seed=0, V=10):
    """Context-free toy: the target's distribution is P[d] at every node of depth d, the draft's Q[d]."""
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(torch.randn(3, V, generator=g) * 1.5, -1)
    Q = torch.softmax(torch.randn(3, V, generator=g) * 1.5, -1)
    return P, Q, g


def _emitted(verify, n=20000, draws=3, deterministic=False, seed=0):
    """Counts of the first and second emitted tokens over n trees: `draws` children at the root, one below each."""
    P, Q, g = _toy(seed)
    first, second = torch.zeros(10), torch.zeros(10)
    for _ in range(n):
        tree = TokenTree(0)
        if deterministic:  # distinct tokens chosen without looking at the target: q is one-hot per child
            for x in torch.randperm(10, generator=g)[:draws].tolist():
                tree.add(tree.add(0, x), int(torch.randint(10, (), generator=g)))
        else:  # independent draws from Q[0], repeats included; each distinct child gets one draw from Q[1]
            for x in torch.multinomial(Q[0], draws, replacement=True, generator=g).tolist():
                child = tree.add_draw(0, x, Q[0])
                if not tree.draws[child]:
                    tree.add_draw(child, int(torch.multinomial(Q[1], 1, generator=g)), Q[1])
        probs = torch.stack([P[d] for d in tree.depths])
        path, nxt = verify(tree, probs, g)
        emitted = [tree.tokens[i] for i in path[1:]] + [nxt]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return P, first, second


@pytest.mark.parametrize("deterministic", [False, True])
def test_sampled_tree_verification_reproduces_the_target_distribution(deterministic):
    P, first, second = _emitted(verify_sampled, deterministic=deterministic)
    assert _chi2(first, P[0]) < CHI2_999[9] and _chi2(second, P[1]) < CHI2_999[9]


def _no_residual(tree, probs, g):
    """Deliberately wrong: after a rejection the next child is tested against the same p (no p ← norm(p − q)⁺)."""
    path = [0]
    while True:
        node = path[-1]
        p, q = probs[node], tree.q[node]
        for child in tree.draws[node]:
            x = tree.tokens[child]
            qx = 1.0 if q is None else float(q[x])
            if float(torch.rand((), generator=g)) < min(1.0, float(p[x]) / qx):
                path.append(child)
                break
        else:
            return path, int(torch.multinomial(p, 1, generator=g))


def test_the_chi2_test_catches_a_verification_that_forgets_the_residual():
    P, first, _ = _emitted(_no_residual)
    assert _chi2(first, P[0]) > 10 * CHI2_999[9]
    assert torch.allclose(residual(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])), torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8", "int4"])
def test_with_the_switch_a_tree_node_gets_the_bits_of_one_token_steps_on_its_path(fmt):
    """Batch invariance for trees: each node attends alone over the keys its row of the mask shows, so its logits
    are bit for bit those of one-token steps along its path, as a k-token pass's are (`test_batch_invariance`;
    the switch leaves one-token steps as they were). The control: without it, bf16 differs where one masked
    attention call rounds unlike each query alone."""
    import copy

    from tests.test_batch_invariance import build, masked_attention_differs

    model = build(fmt)
    history = torch.randint(0, model.config.vocab_size, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    tree = TokenTree.from_branches(history[-1], [[3, 4, 5], [3, 6], [7, 8, 9, 10], [11]])

    @torch.inference_mode()
    def worst(invariant):
        model.batch_invariant = invariant
        base = _prefilled(model, history)
        logits, out = tree_logits(model, copy.deepcopy(base), tree), 0.0
        for i in range(len(tree)):
            steps = copy.deepcopy(base)
            for t in [history[-1]] + tree.path_tokens(i):
                step = model.step(torch.tensor([[t]]), cache=steps)[0, -1]
            out = max(out, float((step.float() - logits[i].float()).abs().max()))
        return out

    assert worst(True) == 0.0
    if fmt == "bfloat16" and masked_attention_differs():  # where one masked call rounds unlike each query alone
        assert worst(False) > 0  # ... the whole tree in one call differs, so the check above can fail


def test_generate_tree_verifies_with_the_switch_on_and_restores_it(pair):
    target, draft, tok = pair
    seen = []
    hook = target.register_forward_pre_hook(lambda m, a: seen.append(m.batch_invariant))
    try:
        out = generate_tree(target, TreeDraftModel(draft), tok, "ROMEO:", max_nodes=4, max_new_tokens=8)
    finally:
        hook.remove()
    assert out.token_ids and all(seen) and target.batch_invariant is False
    with pytest.raises(ValueError, match="batch_invariant must be True or False"):
        generate_tree(target, TreeDraftModel(draft), tok, "ROMEO:", batch_invariant="yes")
