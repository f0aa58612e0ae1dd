"""Speculative decoding: a drafter guesses γ tokens, the target checks them all in one forward pass.

    out = labkit.speculative.generate(target, draft, tok, "To be, or not to be", gamma=4)
    out.text, out.acceptance, out.tokens_per_call, out.wall_s, out.plain   # plain: the same without drafting

Each round: the drafter proposes up to γ tokens; the target runs one forward over the last
emitted token and the γ proposals (γ + 1 positions, on its KV cache); verification
(`labkit.speculative.verify`) keeps the agreed prefix and adds one token of the target's
own; the target's cache is truncated to drop the rejected positions. A round therefore
emits between 1 and γ + 1 tokens for one target pass.

`gamma="auto"` measures passes of γ_start + 1, 2 and 1 tokens first, then picks γ each round from an EMA of the acceptance rate α (accepted / tested drafts) and the measured
costs: a draft step c and a target pass over k tokens T(k), both relative to T(1); it
maximises the expected tokens per unit time E(γ) / (γ·c + T(γ+1)) with
E(γ) = (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023, §3.3), no training needed. γ = 0 (a plain
step, rate 1 / T(1)) is one of its choices: where drafting cannot pay it stops drafting, and every
`PROBE_EVERY`-th such round drafts one token to keep α measured.
`gamma="heuristic"` is Hugging Face's "heuristic" schedule (transformers 5.x defaults to "constant"): γ grows
by 2 after a round whose drafts were all accepted and shrinks by 1 otherwise (between 1 and
`GAMMA_MAX`); it looks at acceptance only, never at the costs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from labkit import checks
from labkit.measure.clock import now as clock_now
from labkit.sampling import SamplingParams, make_generator, process_logits, sample_next
from labkit.quant.rows import INVARIANT_MAX_ROWS
from labkit.speculative.drafters import DraftModel
from labkit.speculative.verify import accept_greedy, accept_sampled

__all__ = ["generate", "SpeculativeOutput", "expected_tokens", "GAMMA_MAX"]

GAMMA_MAX = 8  # the largest gamma 'auto' picks
GAMMA_LIMIT = 64  # the largest fixed gamma accepted
PROBE_EVERY = 8  # 'auto' drafts one token every this many rounds it chose not to draft


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens one round emits on average when each draft token passes with probability α (independently)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    checks.integer("gamma", gamma, 0, why="draft tokens per round")
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


@dataclass
class SpeculativeOutput:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    acceptance: list[float]  # per draft position i: accepted / proposed at that position
    proposed: list[int]  # how often each position was proposed
    gammas: list[int]  # γ of every round
    target_calls: int
    draft_steps: int
    wall_s: float
    plain: dict | None = field(default=None)  # plain decoding of the same prompt: token_ids, wall_s, same_tokens
    tested: int = 0  # draft tokens the verification looked at (it stops at the first rejection)
    accepted: int = 0  # of which accepted
    prefill_s: float = 0.0  # the prompt's pass and the first token (wall_s − prefill_s: the rounds)
    draft_s: float = 0.0  # seconds the drafter spent proposing, all rounds together
    reached: list[int] = field(default_factory=list)  # per draft position: rounds that proposed it with all before accepted

    @property
    def alpha(self) -> float:
        """The acceptance rate α: accepted / tested draft tokens (the estimate that E(γ) takes)."""
        return self.accepted / self.tested if self.tested else 0.0

    @property
    def tokens_per_call(self) -> float:
        return len(self.token_ids) / max(1, self.target_calls)

    @property
    def speedup(self) -> float | None:
        return None if not self.plain else self.plain["wall_s"] / self.wall_s


def _check(target, draft, gamma, max_new_tokens):
    if not (gamma in ("auto", "heuristic") or (checks.is_int(gamma) and 1 <= gamma <= GAMMA_LIMIT)):
        raise ValueError(f"gamma must be an integer in [1, {GAMMA_LIMIT}], 'auto' or 'heuristic', got {gamma!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    dm = getattr(draft, "model", None)
    if dm is not None and dm.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"the draft's vocabulary ({dm.config.vocab_size}) differs from the target's "
                         f"({target.config.vocab_size}): speculative decoding needs the same token ids")


class _AutoGamma:
    """γ from the EMA of acceptance and the measured relative costs (see the module docstring)."""

    def __init__(self, start: int = 4, decay: float = 0.8):
        self.alpha, self.decay, self.gamma, self.start = 0.6, decay, start, start
        self.draft_s: float | None = None
        self.target_s: dict[int, float] = {}
        self.plain_rounds = 0  # rounds run without drafting since the last draft

    def update(self, proposed: int, accepted: int, draft_s: float, target_s: float) -> None:
        if proposed:
            # α is a per-position pass rate: a round tests the accepted drafts and the first rejected one (if any).
            # accepted / proposed would count the drafts after a rejection, never tested, as failures.
            tested = accepted + (accepted < proposed)
            self.alpha = self.decay * self.alpha + (1 - self.decay) * accepted / tested
            per = draft_s / proposed
            self.draft_s = per if self.draft_s is None else self.decay * self.draft_s + (1 - self.decay) * per
        k = proposed + 1
        old = self.target_s.get(k)
        self.target_s[k] = target_s if old is None else self.decay * old + (1 - self.decay) * target_s

    def _t(self, k: int) -> float:  # T(k): measured, else a straight line through what was measured
        if k in self.target_s:
            return self.target_s[k]
        pts = sorted(self.target_s.items())
        if len(pts) < 2:
            return pts[0][1] if pts else 1.0
        (k0, t0), (k1, t1) = pts[0], pts[-1]
        return max(t0, t0 + (t1 - t0) * (k - k0) / (k1 - k0))

    def next(self) -> int:
        for k in (self.start + 1, 2, 1):
            # explore: the start γ, then γ = 1, then one plain step, so that T(k) is measured at three lengths
            # (T(1) among them: the cost of not drafting) before the model is used
            if k not in self.target_s:
                return k - 1
        if self.draft_s is None:
            return self.start
        a = min(self.alpha, 0.999)
        rate = {g: expected_tokens(a, g) / (g * self.draft_s + self._t(g + 1)) for g in range(1, GAMMA_MAX + 1)}
        rate[0] = 1 / self._t(1)  # a plain step
        best = max(rate, key=rate.get)
        if best == 0:
            self.plain_rounds += 1
            if self.plain_rounds % PROBE_EVERY == 0:
                best = 1  # a probe: without drafts α would never be measured again
        else:
            self.plain_rounds = 0
        self.gamma = best
        return best


class _HeuristicGamma:
    """The schedule of Hugging Face's assisted generation ("heuristic"): +2 after a fully accepted round, else −1."""

    def __init__(self, start: int = 4):
        self.gamma = start

    def update(self, proposed: int, accepted: int, draft_s: float, target_s: float) -> None:
        if proposed:
            self.gamma = min(GAMMA_MAX, self.gamma + 2) if accepted == proposed else max(1, self.gamma - 1)

    def next(self) -> int:
        return self.gamma


@torch.inference_mode()
def generate(target, draft, tok, prompt, gamma: int | str = 4, max_new_tokens: int = 64, seed: int | None = 0,
             chat: bool | None = None, compare: bool = False, batch_invariant: bool = True,
             **sampling) -> SpeculativeOutput:
    """Generate with speculative decoding; `draft` is a model (same vocabulary) or a drafter object.

    `batch_invariant` (default on): the target's verification passes give each position the bits a one-token
    step gives it (`labkit.model.kernels`), so greedy output does not depend on γ. A one-token step takes the
    same call with the switch or without as long as the model keeps its default product (`lean_step` on,
    `split_matvec` off), so greedy output then equals plain greedy decoding bit for bit in every format; with
    another plain product the last bits of the plain step differ, and only a near-tie can expose that. Off:
    the fast default kernels, and a near-tie may flip. The mode covers passes of up to `INVARIANT_MAX_ROWS`
    (16) tokens, so with it a fixed γ may be at most 15 (a `ValueError` says so); without it, up to 64.
    """
    if batch_invariant is True and checks.is_int(gamma) and gamma + 1 > INVARIANT_MAX_ROWS:
        raise ValueError(f"gamma must be at most {INVARIANT_MAX_ROWS - 1} with batch_invariant=True (passes of up to "
                         f"{INVARIANT_MAX_ROWS} tokens are row-invariant), got {gamma!r}; pass batch_invariant=False "
                         f"for longer drafts, whose greedy output may then depend on gamma")
    return run_exact(target, batch_invariant, lambda: _generate(target, draft, tok, prompt, gamma, max_new_tokens, seed,
                                                                chat, sampling),
                     compare and (tok, max_new_tokens, seed, sampling))


def run_exact(target, batch_invariant: bool, loop, compare=None):
    """Run a speculative `loop()` with the target batch-invariant (or not, `batch_invariant`), then, when `compare`
    is (tok, max_new_tokens, seed, sampling), decode the same prompt plainly into `result.plain`."""
    checks.flag("batch_invariant", batch_invariant)
    if getattr(getattr(target, "config", None), "compressed_attention", False):
        raise ValueError("speculative decoding rolls back rejected tokens, and a compressed-attention target's cache "
                         "cannot (finished blocks are merged into entries): use a dense target")
    if not hasattr(target, "batch_invariant"):
        raise TypeError(f"target must be a labkit Transformer, got {type(target).__name__}")
    from labkit.model.kernels import batch_invariant as invariant

    with invariant(target, batch_invariant):
        result = loop()
    if compare:
        tok, max_new_tokens, seed, sampling = compare
        attach_plain(result, target, tok, max_new_tokens, seed, SamplingParams.from_kwargs(None, **sampling))
    return result


def emitted(new: list[int], eos, room: int) -> list[int]:
    """What a round emits of `new` (accepted drafts and the target's token): through an end token, at most `room`."""
    if eos in new:
        new = new[:new.index(eos) + 1]
    return new[:room]


def attach_plain(result: SpeculativeOutput, target, tok, max_new_tokens: int, seed, params) -> None:
    """Decode the same prompt plainly (the target's default kernels) and record it in `result.plain`."""
    from labkit.generation.reply import generate as plain_generate

    plain = plain_generate(target, tok, result.prompt_ids, max_new_tokens=max_new_tokens, seed=seed, params=params)
    result.plain = {"token_ids": plain.token_ids, "wall_s": plain.total_s, "same_tokens": plain.token_ids == result.token_ids}


def _generate(target, draft, tok, prompt, gamma, max_new_tokens, seed, chat, sampling) -> SpeculativeOutput:
    from labkit.generation.reply import encode_prompt

    constrained = sorted({"regex", "json_schema", "choices"} & set(sampling))
    if constrained:
        raise ValueError(f"speculative decoding does not honour constraints ({', '.join(constrained)}): the draft's "
                         "tokens are not masked; use labkit.generate for constrained decoding")
    if not hasattr(draft, "propose") and not (hasattr(draft, "new_cache") and hasattr(draft, "config")):
        raise TypeError(f"draft must be a draft model (a labkit Transformer with the target's vocabulary) or a drafter "
                        f"object (labkit.speculative.PromptLookup(), LayerSkip(target, k), MTPDrafter.from_file(target)), "
                        f"got {type(draft).__name__} {draft!r}"[:300])
    drafter = draft if hasattr(draft, "propose") else DraftModel(draft)
    _check(target, drafter, gamma, max_new_tokens)
    params = SamplingParams.from_kwargs(None, **sampling)
    ids = encode_prompt(tok, prompt, chat)
    eos = getattr(tok, "eos_id", None)
    schedule = _AutoGamma() if gamma == "auto" else _HeuristicGamma() if gamma == "heuristic" else None  # γ per round
    t0 = clock_now()
    gen = make_generator(seed) if not params.greedy else None
    cache = target.new_cache(max_len=min(target.config.max_seq_len, len(ids) + max_new_tokens + GAMMA_LIMIT + 2))
    if hasattr(drafter, "attach"):
        drafter.attach(cache)
    logits = target(torch.tensor([ids]), cache=cache, last_only=True)[0, -1].float()
    first = sample_next(logits, ids, params, gen)
    prefill_s = clock_now() - t0
    history, out = ids + [first], [first]
    proposed, accepted, reached, gammas, calls = [0] * GAMMA_LIMIT, [0] * GAMMA_LIMIT, [0] * GAMMA_LIMIT, [], 1
    tested, draft_s = 0, 0.0
    while len(out) < max_new_tokens and out[-1] != eos:
        g = schedule.next() if schedule else gamma
        g = max(0, min(g, max_new_tokens - len(out) - 1, cache.max_len - cache.seq_len - 2))
        d0 = clock_now()
        drafted, q = drafter.propose(history, g, params, gen) if g else ([], None)
        d1 = clock_now()
        draft_s += d1 - d0
        x = torch.tensor([[history[-1]] + drafted])
        logits = target(x, cache=cache)[0].float()  # [k + 1, V]
        t1 = clock_now()
        calls += 1
        # the sampler pipeline, applied to every position with the history that position would have
        processed = torch.stack([process_logits(logits[i], history + drafted[:i], params) for i in range(len(drafted) + 1)])
        if params.greedy:
            n, nxt = accept_greedy(processed, torch.tensor(drafted, dtype=torch.long))
        else:
            n, nxt = accept_sampled(torch.softmax(processed, -1), q, torch.tensor(drafted, dtype=torch.long), gen)
        cache.truncate(len(history) + n)
        tested += min(n + 1, len(drafted))
        for i in range(len(drafted)):
            proposed[i] += 1
            accepted[i] += i < n
            reached[i] += i <= n
        if schedule:
            schedule.update(len(drafted), n, d1 - d0, t1 - d1)
        gammas.append(len(drafted))
        new = emitted(drafted[:n] + [nxt], eos, max_new_tokens - len(out))
        history += new
        out += new
    wall = clock_now() - t0
    depth = max((i + 1 for i, n in enumerate(proposed) if n), default=0)
    result = SpeculativeOutput(
        text=tok.decode([i for i in out if i != eos]), token_ids=out, prompt_ids=ids,
        acceptance=[accepted[i] / proposed[i] for i in range(depth)], proposed=proposed[:depth], gammas=gammas,
        target_calls=calls, draft_steps=getattr(drafter, "steps", 0), wall_s=wall, tested=tested,
        accepted=sum(accepted), prefill_s=prefill_s, draft_s=draft_s, reached=reached[:depth])
    return result
