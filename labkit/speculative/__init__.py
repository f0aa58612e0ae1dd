"""Speculative decoding: drafters (`drafters`), exact verification (`verify`), the decoding loop (`decode`),
the measured costs and the speed-up formula (`costs`)."""
from labkit.speculative.decode import GAMMA_MAX, SpeculativeOutput, expected_tokens, generate
from labkit.speculative.drafters import DraftModel, LayerSkip, PromptLookup
from labkit.speculative.verify import accept_greedy, accept_sampled, residual

__all__ = ["generate", "SpeculativeOutput", "expected_tokens", "GAMMA_MAX", "DraftModel", "PromptLookup", "LayerSkip",
           "accept_greedy", "accept_sampled", "residual"]
