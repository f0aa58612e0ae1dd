"""Chapter 05's exercise checkers pass the reference solutions and fail plausible wrong answers."""
import math

import pytest
import torch

import labkit
from labkit.exercises.constrained import _reference_allowed, _reference_answer_probs
from labkit.exercises.sampling import _flip_cases, _reference_flip
from tests.conftest import assert_checker_separates


def top_p_right(logits, top_p):
    probs = logits.softmax(-1)
    sorted_probs, order = probs.sort(descending=True)
    n_keep = int((sorted_probs.cumsum(-1) < top_p).sum()) + 1
    out = torch.full_like(logits, float("-inf"))
    out[order[:n_keep]] = logits[order[:n_keep]]
    return out


def top_p_before(logits, top_p):  # the other correct form: keep while the mass before the token is below p
    sorted_probs, order = logits.softmax(-1).sort(descending=True)
    keep = (sorted_probs.cumsum(-1) - sorted_probs) < top_p
    out = torch.full_like(logits, float("-inf"))
    out[order[keep]] = logits[order[keep]]
    return out


def top_p_without_crossing(logits, top_p):  # drops the token that crosses p
    sorted_probs, order = logits.softmax(-1).sort(descending=True)
    keep = sorted_probs.cumsum(-1) <= top_p
    out = torch.full_like(logits, float("-inf"))
    out[order[keep]] = logits[order[keep]]
    return out


def top_p_unsorted(logits, top_p):  # walks the tokens in id order
    probs = logits.softmax(-1)
    keep = (probs.cumsum(-1) - probs) < top_p
    return torch.where(keep, logits, torch.tensor(float("-inf"), dtype=logits.dtype))


def top_p_all_ties(logits, top_p):  # keeps every token tied with the crossing one
    sorted_probs, order = logits.softmax(-1).sort(descending=True)
    n_keep = int((sorted_probs.cumsum(-1) < top_p).sum()) + 1
    cut = sorted_probs[min(n_keep, len(sorted_probs)) - 1]
    probs = logits.softmax(-1)
    return torch.where(probs >= cut, logits, torch.tensor(float("-inf"), dtype=logits.dtype))


def top_p_on_logits(logits, top_p):  # cumulates logits instead of probabilities
    sorted_l, order = logits.sort(descending=True)
    n_keep = int((sorted_l.cumsum(-1) < top_p).sum()) + 1
    out = torch.full_like(logits, float("-inf"))
    out[order[:n_keep]] = logits[order[:n_keep]]
    return out


def test_top_p_accepts_both_correct_forms(capsys):
    assert labkit.exercises.check_top_p(top_p_right)
    assert labkit.exercises.check_top_p(top_p_before)
    assert capsys.readouterr().out.count("[PASS]") == 2


@pytest.mark.parametrize("wrong", [top_p_without_crossing, top_p_unsorted, top_p_all_ties, top_p_on_logits])
def test_top_p_rejects(wrong, capsys):
    assert_checker_separates("check_top_p", top_p_right, wrong, capsys)


def flip_naive(logits, history):  # ignores the signs: s / u always
    seen = set(history)
    s = max(float(logits[t]) for t in seen)
    u = max(float(logits[t]) for t in range(len(logits)) if t not in seen)
    return max(1.0, s / u)


def flip_runner_up(logits, history):  # uses the second logit overall, seen or not
    top2 = logits.topk(2).values
    return _reference_flip(torch.stack([top2[0], top2[1]]), [0])


def flip_per_occurrence(logits, history):  # penalises each occurrence: theta ** count
    count = history.count(int(logits.argmax()))
    value = _reference_flip(logits, history)
    return value ** (1 / max(1, count)) if math.isfinite(value) else value


@pytest.mark.parametrize("wrong", [flip_naive, flip_runner_up, flip_per_occurrence])
def test_flip_penalty_rejects(wrong, capsys):
    assert_checker_separates("check_flip_penalty", _reference_flip, wrong, capsys)


def test_flip_penalty_reference_is_what_greedy_does():
    from labkit.sampling import process_logits

    for logits, history in _flip_cases():
        theta = _reference_flip(logits, history)
        picks = lambda th: int(process_logits(logits, history, temperature=1.0, repetition_penalty=th).argmax())  # noqa: E731
        if math.isinf(theta):
            assert picks(1e6) in set(history)
        else:
            assert picks(theta * (1 + 1e-6)) not in set(history)
            if theta > 1.0:
                assert picks(theta * (1 - 1e-6)) in set(history)


def allowed_no_pruning(table, accepting, vocab, state, eos_id):  # the byte walk alone, EOS handled
    out = [i for i, d in enumerate(vocab) if i != eos_id and d and _walk_ok(table, state, d)]
    return sorted(out + ([eos_id] if accepting[state] else [])) or _raise()


def allowed_eos_always(table, accepting, vocab, state, eos_id):
    try:
        out = _reference_allowed(table, accepting, vocab, state, eos_id)
    except ValueError:
        out = []
    return sorted(set(out) | {eos_id})


def allowed_empty_list(table, accepting, vocab, state, eos_id):  # returns [] instead of raising
    try:
        return _reference_allowed(table, accepting, vocab, state, eos_id)
    except ValueError:
        return []


def allowed_one_step(table, accepting, vocab, state, eos_id):  # prunes only states with no token out at all
    def ends(s, d):
        for b in d:
            s = table[s][b]
            if s < 0:
                return -1
        return s
    tokens = [i for i, d in enumerate(vocab) if i != eos_id and d]
    out = []
    for i in tokens:
        s = ends(state, vocab[i])
        if s >= 0 and (accepting[s] or any(ends(s, vocab[j]) >= 0 for j in tokens)):
            out.append(i)
    return sorted(out + ([eos_id] if accepting[state] else [])) or _raise()


def _walk_ok(table, s, d):
    for b in d:
        s = table[s][b]
        if s < 0:
            return False
    return True


def _raise():
    raise ValueError("nothing allowed")


@pytest.mark.parametrize("wrong", [allowed_no_pruning, allowed_eos_always, allowed_empty_list, allowed_one_step])
def test_allowed_tokens_rejects(wrong, capsys):
    assert_checker_separates("check_allowed_tokens", _reference_allowed, wrong, capsys)


def test_allowed_tokens_reference_matches_the_library_automaton():
    """The exercise's rule is the one `TokenAutomaton` applies, on every state tokens can reach."""
    from labkit.exercises.constrained import _allowed_cases
    from labkit.sampling.constrained import TokenAutomaton
    from labkit.sampling.regex_dfa import DFA
    import numpy as np

    class Tok:
        def __init__(self, vocab, eos):
            self.vocab, self.eos_id, self.vocab_size = vocab, eos, len(vocab)

        def is_special(self, i):
            return i == self.eos_id

        def token_bytes(self, i):
            return self.vocab[i]

    compared = 0
    for table, accepting, vocab, state, eos in _allowed_cases():
        dfa = DFA("case", np.array(table, dtype=np.int32), np.array(accepting))
        try:
            auto = TokenAutomaton(Tok(vocab, eos), dfa)
        except ValueError:  # the library refuses a pattern the vocabulary cannot spell: so does the reference
            with pytest.raises(ValueError):
                _reference_allowed(table, accepting, vocab, 0, eos)
            continue
        if state in auto._rows:
            library = torch.nonzero(auto.mask(state)).flatten().tolist()
            if library:
                assert library == _reference_allowed(table, accepting, vocab, state, eos)
            else:  # a dead end the library reaches but never offers: the exercise raises there
                with pytest.raises(ValueError):
                    _reference_allowed(table, accepting, vocab, state, eos)
            compared += 1
    assert compared >= 10


def answers_global(model, answers):  # renormalises whole-sequence probabilities: what the mask does *not* do
    seq = []
    for a in answers:
        p = 1.0
        for i, t in enumerate(a):
            p *= float(model(tuple(a[:i]))[t])
        seq.append(p)
    return [p / sum(seq) for p in seq]


def answers_first_step_only(model, answers):  # masks the first step, then lets the model run free
    firsts = {a[0] for a in answers}
    p0 = model(())
    out = []
    for a in answers:
        p = float(p0[a[0]]) / sum(float(p0[t]) for t in firsts)
        for i in range(1, len(a)):
            p *= float(model(tuple(a[:i]))[a[i]])
        out.append(p)
    return out


def answers_by_position(model, answers):  # allows every answer's i-th token at step i, whatever the text so far
    out = []
    for a in answers:
        p = 1.0
        for i, t in enumerate(a):
            probs = model(tuple(a[:i]))
            allowed = {b[i] for b in answers if len(b) > i}
            p *= float(probs[t]) / sum(float(probs[u]) for u in allowed)
        out.append(p)
    return out


@pytest.mark.parametrize("wrong", [answers_global, answers_first_step_only, answers_by_position])
def test_masked_answer_probs_rejects(wrong, capsys):
    assert_checker_separates("check_masked_answer_probs", _reference_answer_probs, wrong, capsys)


def test_stubs_print_todo(capsys):
    def stub(*args):
        raise NotImplementedError

    for name in ["check_top_p", "check_flip_penalty", "check_allowed_tokens", "check_masked_answer_probs"]:
        assert not getattr(labkit.exercises, name)(stub)
    assert capsys.readouterr().out.count("[TODO]") == 4


def test_allowed_tokens_accepts_any_sequence_of_ids(capsys):
    """A right answer returned as a tensor or a tuple passes; the order still matters."""
    as_tensor = lambda *a: torch.tensor(_reference_allowed(*a))  # noqa: E731
    as_tuple = lambda *a: tuple(_reference_allowed(*a))  # noqa: E731
    reversed_order = lambda *a: list(reversed(_reference_allowed(*a)))  # noqa: E731
    assert labkit.exercises.check_allowed_tokens(as_tensor)
    assert labkit.exercises.check_allowed_tokens(as_tuple)
    assert not labkit.exercises.check_allowed_tokens(reversed_order)
    assert capsys.readouterr().out.count("[PASS]") == 2


def _cutoff(logits, *, include_own=False, by_prob=False, zero=False):
    p = logits.softmax(-1).double()
    logp = p.log()
    entropy = -(p * logp).nansum()
    dist = (-logp - entropy).abs()
    fav = int(p.argmax())
    if by_prob:  # ranks by probability, as top-p does
        before = p > p[fav]
    else:
        before = dist < dist[fav]
    mass = float(p[before].sum() + (p[fav] if include_own else 0))
    if not before.any():
        return 0.0 if zero else None
    return mass


@pytest.mark.parametrize("wrong", [
    lambda lg: _cutoff(lg, include_own=True),   # the favourite's own mass counted
    lambda lg: _cutoff(lg, by_prob=True),       # ranked by probability, not by typicality
    lambda lg: _cutoff(lg, zero=True),          # 0 where nothing removes it
])
def test_the_typical_cutoff_checker_separates(wrong, capsys):
    assert_checker_separates("check_typical_cutoff", _cutoff, wrong, capsys)


def _spellings(text, vocab, *, greedy=False, prefix_ok=False, empty=1):
    if greedy:  # longest match first: one spelling or none
        i = 0
        while i < len(text):
            best = max((v for v in vocab if v and text.startswith(v, i)), key=len, default=None)
            if best is None:
                return 0
            i += len(best)
        return 1
    ways = [empty] + [0] * len(text)
    for end in range(1, len(text) + 1):
        ways[end] = sum(ways[s] for s in range(end) if text[s:end] in vocab)
    return max(ways) if prefix_ok else ways[-1]


@pytest.mark.parametrize("wrong", [
    lambda t, v: _spellings(t, v, greedy=True),      # the tokenizer's one spelling
    lambda t, v: _spellings(t, v, prefix_ok=True),   # a spelling of a prefix counted
    lambda t, v: _spellings(t, v, empty=0),          # the empty prefix has no spelling: everything is 0
])
def test_the_spellings_checker_separates(wrong, capsys):
    assert_checker_separates("check_count_spellings", _spellings, wrong, capsys)
