"""A stand-in model that replays recorded greedy replies: a load sweep's passes without running the network.

Under greedy decoding, with `Engine(batch_invariant=True)`, a request's reply does not depend on what
shares its passes, drafted tokens or not (the engine's tests check it token for token). Once every
request of a workload has been served once by the real model and its reply recorded, any later replay
of those requests, under any scheduler, load or speculation budget, emits the same tokens; all that
changes is which passes carry them and what the passes cost. `RecordedModel` hands the engine exactly
those tokens: each row's logits put their mass on the recorded next token, so the engine's own
scheduler, drafter, budget, verification and rollback run unchanged. With `Engine(pass_time=...)` (a
machine's measured pass costs, `passcost.step_time`, or the cost model's pass on a GPU) a sweep of
arrival rates replays in seconds, each pass timed as that machine would take it.

It checks what it is fed and refuses to invent: a row whose committed tokens leave the recorded
sequence, or that asks for a token past its end, raises `ValueError` (a sampled request, another
prompt, a longer reply cap than was recorded). Drafted tokens may differ from the recording (those
are the ones verification rejects); the logits after a wrong drafted token are never used.

    model = RecordedModel(smol.config, {req.id: req.prompt + req.output for req in served})
    engine = Engine(model, drafter=PromptLookup(), spec_budget="auto", pass_time=step_time(table))
"""
from __future__ import annotations

from dataclasses import replace

import torch

__all__ = ["RecordedModel"]


class RecordedModel:
    """The engine's model interface over `sequences` {request id: prompt + recorded reply token ids}."""

    dtype = torch.float32
    device = torch.device("cpu")

    def __init__(self, config, sequences: dict):
        if not isinstance(sequences, dict) or not sequences:
            raise ValueError("sequences must be a non-empty dict {request id: prompt + recorded reply token ids}")
        for key, seq in sequences.items():
            if not isinstance(seq, (list, tuple)) or len(seq) < 2 or not all(
                    isinstance(t, int) and 0 <= t < config.vocab_size for t in seq):
                raise ValueError(f"sequences[{key!r}] must hold at least 2 token ids in [0, {config.vocab_size})")
        # a one-dimensional KV pool: the engine's block tables are real, the keys and values are never read
        self.config = replace(config, name=f"recorded {config.name}", d_model=2, n_layers=1, n_heads=1, n_kv_heads=1,
                              head_dim=None)
        self.sequences = {key: list(seq) for key, seq in sequences.items()}
        self.passes = 0

    def __call__(self, ids: torch.Tensor, cache, last_only: bool = True) -> torch.Tensor:
        if not last_only:
            raise ValueError("RecordedModel gives the logits a serving pass keeps (last_only=True) only")
        flat = ids[0].tolist()
        cache.begin(len(flat))
        try:
            targets, at = [], 0
            for key, start, n, keep in cache.pass_rows():
                seq = self.sequences.get(key)
                if seq is None:
                    raise ValueError(f"no recorded sequence for request {key!r}")
                fed = flat[at:at + n]
                at += n
                committed = n - keep + 1  # a speculative row's first token is verified, its drafted ones are not
                if fed[:committed] != seq[start:start + committed]:
                    raise ValueError(f"request {key!r} left its recorded sequence at position {start}: the replay "
                                     "diverged (a sampled request, another prompt)")
                for p in range(start + n - keep, start + n):
                    if p + 1 < len(seq):
                        targets.append(seq[p + 1])
                    elif p == start + n - keep:
                        raise ValueError(f"request {key!r} asks for token {p + 1}, past its recorded {len(seq)}: "
                                         "its reply cap is longer than the one recorded")
                    else:
                        targets.append(seq[-1])  # after a drafted token past the end: never used
        except Exception:
            cache.abort()
            raise
        cache.end()
        self.passes += 1
        logits = torch.zeros(len(targets), self.config.vocab_size)
        logits[torch.arange(len(targets)), torch.tensor(targets)] = 1.0
        return logits[None]
