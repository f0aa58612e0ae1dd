"""Speculative decoding: drafters (`drafters`, and the MTP head on a frozen backbone in `mtp`), exact
verification (`verify`), the decoding loop (`decode`), the measured costs and the speed-up formula (`costs`)."""
from labkit.speculative.decode import GAMMA_MAX, SpeculativeOutput, expected_tokens, generate
from labkit.speculative.drafters import DraftModel, LayerSkip, PromptLookup
from labkit.speculative.mtp import MTPDrafter, MTPHead, load_head, save_head
from labkit.speculative.verify import accept_greedy, accept_sampled, residual

__all__ = ["generate", "SpeculativeOutput", "expected_tokens", "GAMMA_MAX", "DraftModel", "PromptLookup", "LayerSkip",
           "MTPHead", "MTPDrafter", "load_head", "save_head", "accept_greedy", "accept_sampled", "residual"]
