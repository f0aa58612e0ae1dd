"""Beam search: exhaustive beams equal brute force, one beam equals greedy, the
early-stopping modes differ only as documented, parity with transformers' beam search."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.sampling import beam_search


class TableModel:
    """A toy LM whose next-token logits depend on the position and the last token: `[B, T] -> [B, T, V]`."""

    def __init__(self, vocab: int, max_len: int, seed: int, sharpness: float = 2.0):
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.randn(max_len, vocab, vocab, generator=gen, dtype=torch.float64) * sharpness
        self.calls = 0

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        T = ids.shape[1]
        return self.table[torch.arange(T), ids]  # [B, T, V]

    def logprob(self, seq: list[int], prompt_len: int) -> float:
        lp = torch.log_softmax(self(torch.tensor([seq]))[0], dim=-1)
        return sum(float(lp[t - 1, seq[t]]) for t in range(prompt_len, len(seq)))


def brute_force(model: TableModel, prompt: list[int], V: int, max_new: int, lp: float, eos: int | None):
    """Best (score, sequence) over every continuation: ends at EOS or at max_new tokens."""
    best = (float("-inf"), None)
    for n in range(1, max_new + 1):
        for tail in itertools.product(range(V), repeat=n):
            if eos is not None and eos in tail[:-1]:
                continue  # generation would have stopped earlier
            if n < max_new and tail[-1] != eos:
                continue  # a shorter output must end in EOS
            seq = prompt + list(tail)
            score = model.logprob(seq, len(prompt)) / n**lp
            if score > best[0]:
                best = (score, seq)
    return best


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    lp=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]),
    eos=st.sampled_from([None, 0, 2]),
    early=st.sampled_from([False, True, "never"]),
)
def test_exhaustive_beams_equal_brute_force(seed, lp, eos, early):
    V, L = 3, 3
    model = TableModel(V, 8, seed)
    prompt = [1, 0]
    want_score, want_seq = brute_force(model, prompt, V, L, lp, eos)
    out = beam_search(model, prompt, num_beams=V**L, max_new_tokens=L, length_penalty=lp,
                      early_stopping=early, eos_token_id=eos)
    assert out.sequences[0] == want_seq
    assert out.scores[0] == pytest.approx(want_score, abs=1e-9)
    assert out.scores == sorted(out.scores, reverse=True)
    # every reported score is its sequence's log-probability / length ** lp
    for seq, score in zip(out.sequences, out.scores):
        n = len(seq) - len(prompt)
        assert score == pytest.approx(model.logprob(seq, len(prompt)) / n**lp, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), eos=st.sampled_from([None, 1]), lp=st.sampled_from([0.0, 1.0, 2.0]))
def test_one_beam_is_greedy(seed, eos, lp):
    model = TableModel(6, 16, seed, sharpness=1.0)
    seq = [3]
    for _ in range(10):
        nxt = int(torch.argmax(model(torch.tensor([seq]))[0, -1]))
        seq.append(nxt)
        if nxt == eos:
            break
    out = beam_search(model, [3], num_beams=1, max_new_tokens=10, eos_token_id=eos, length_penalty=lp)
    assert out.sequences == [seq]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), lp=st.sampled_from([-0.5, 0.0, 1.0, 2.0]))
def test_later_stopping_never_gives_a_worse_best_hypothesis(seed, lp):
    # The three modes run identical steps until the earliest one stops; later steps only
    # add hypotheses, so: best("never") >= best(False) >= best(True), and "never" == False
    # when length_penalty <= 0 (then both use the current length as the bound).
    model = TableModel(5, 16, seed, sharpness=1.5)
    runs = {e: beam_search(model, [0], num_beams=2, max_new_tokens=8, length_penalty=lp,
                           early_stopping=e, eos_token_id=4) for e in (True, False, "never")}
    assert runs["never"].scores[0] >= runs[False].scores[0] - 1e-12
    assert runs[False].scores[0] >= runs[True].scores[0] - 1e-12
    assert runs["never"].steps >= runs[False].steps >= runs[True].steps
    if lp <= 0:
        assert runs["never"].sequences == runs[False].sequences


def test_early_stopping_true_stops_as_soon_as_num_beams_hypotheses_finish():
    # step 1: tokens 0 and 1 are likely; step 2: EOS (token 2) is likely after both, so two
    # hypotheses of length 2 finish; afterwards token 0 is near certain, so a beam that
    # survives step 2 without EOS grows long at almost no cost.
    table = torch.zeros(8, 3, 3, dtype=torch.float64)
    table[0, 0] = torch.tensor([3.0, 3.0, -4.0])
    table[1, :] = torch.tensor([0.0, 0.0, 5.0])
    table[2:, :, 0] = 8.0
    model = lambda ids: table[torch.arange(ids.shape[1]), ids]
    kw = dict(num_beams=2, max_new_tokens=6, eos_token_id=2)
    eager = beam_search(model, [0], length_penalty=2.0, early_stopping=True, **kw)
    assert eager.steps == 2 and [len(s) for s in eager.sequences] == [3, 3]
    # the heuristic compares the best running beam at its *current* length: -5.7 / 2**2 loses, it stops too
    assert beam_search(model, [0], length_penalty=2.0, early_stopping=False, **kw).steps == 2
    # "never" bounds the running beams by the longest length they can reach: it searches on,
    # and with length_penalty 2 the long hypothesis beats the short ones
    never = beam_search(model, [0], length_penalty=2.0, early_stopping="never", **kw)
    assert never.steps == 6 and len(never.sequences[0]) == 7
    assert never.scores[0] > eager.scores[0]
    # with length_penalty 0 the short hypotheses are better and every mode agrees
    short = [beam_search(model, [0], length_penalty=0.0, early_stopping=e, **kw).sequences[0] for e in (True, False, "never")]
    assert short[0] == short[1] == short[2] and len(short[0]) == 3


def test_bad_arguments():
    model = TableModel(3, 4, 0)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="num_beams must be a positive integer"):
            beam_search(model, [0], num_beams=bad)
    with pytest.raises(ValueError, match="early_stopping"):
        beam_search(model, [0], early_stopping="sometimes")
    with pytest.raises(ValueError, match="max_new_tokens"):
        beam_search(model, [0], max_new_tokens=-1)


def test_parity_with_transformers_beam_search():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                   eos_token_id=5, pad_token_id=0, bos_token_id=1)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(40)  # sharper distributions: EOS is chosen sometimes
    prompt = torch.tensor([[1, 7, 9, 3]])
    for lp, early in [(1.0, False), (2.0, "never"), (0.5, True), (-1.0, False)]:
        with torch.no_grad():
            ref = hf.generate(prompt, num_beams=3, max_new_tokens=8, length_penalty=lp, early_stopping=early,
                              do_sample=False, return_dict_in_generate=True, output_scores=True,
                              num_return_sequences=3)
            ours = beam_search(lambda ids: hf(ids).logits, prompt, num_beams=3, max_new_tokens=8,
                               length_penalty=lp, early_stopping=early, eos_token_id=5)
        for i in range(3):
            seq = ref.sequences[i].tolist()
            if 5 in seq[4:]:
                seq = seq[: 4 + seq[4:].index(5) + 1]  # drop the padding after EOS
            assert ours.sequences[i] == seq, (lp, early, i)
            assert ours.scores[i] == pytest.approx(float(ref.sequences_scores[i]), abs=1e-4)


def test_a_model_that_can_skip_positions_is_asked_for_the_last_one_only():
    class LastOnly(TableModel):
        def forward(self, ids, last_only=False):
            self.last_only_calls = getattr(self, "last_only_calls", 0) + bool(last_only)
            out = TableModel.__call__(self, ids)
            return out[:, -1:] if last_only else out

        __call__ = forward

    plain, skipping = TableModel(4, 8, 3), LastOnly(4, 8, 3)
    a = beam_search(plain, [1], num_beams=3, max_new_tokens=5, eos_token_id=0)
    b = beam_search(skipping, [1], num_beams=3, max_new_tokens=5, eos_token_id=0)
    assert a.sequences == b.sequences and a.scores == b.scores
    assert skipping.last_only_calls == b.steps


@pytest.mark.parametrize("lp, early", [(1.0, False), (2.0, "never"), (0.5, True)])
def test_kv_cache_beams_equal_recomputed_beams(lp, early):
    """One cache row per beam, reordered to the parents each step, gives the search a full recompute gives."""
    from tests.kvcache_shared import tiny

    model = tiny(seed=2).double()
    lengths = []
    model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape))
    kw = dict(num_beams=3, max_new_tokens=9, length_penalty=lp, early_stopping=early, eos_token_id=4)
    cached = beam_search(model, [7, 1, 30, 12], cache=True, **kw)
    steps_shapes, lengths[:] = list(lengths), []
    full = beam_search(model, [7, 1, 30, 12], cache=False, **kw)
    assert cached.sequences == full.sequences and cached.steps == full.steps
    assert cached.scores == pytest.approx(full.scores, abs=1e-9)
    assert steps_shapes[0] == (1, 4) and all(s[1] == 1 for s in steps_shapes[1:])  # prefill once, then one token a beam
    assert lengths[-1][1] == 4 + full.steps - 1  # the recompute re-reads everything
    assert beam_search(model, [7, 1, 30, 12], **kw).sequences == cached.sequences  # a labkit model caches by default


def test_cache_argument_is_checked():
    model = TableModel(3, 4, 0)
    with pytest.raises(ValueError, match="new_cache"):
        beam_search(model, [0], cache=True)
    with pytest.raises(ValueError, match="cache must be"):
        beam_search(model, [0], cache="yes")
