"""Quality, measured one way everywhere: perplexity, KL to a reference, top-1 agreement, repetition.

These take the logits or ids they are given (or call the model they are handed); they
import nothing else from labkit, so every layer above can measure with them.
"""
from labkit.metrics.compare import kl_to_reference, top1_agreement
from labkit.metrics.likelihood import bits_per_byte, cache_logits, nll, perplexity
from labkit.metrics.protocol import quality, reference_logits, scored_logits
from labkit.metrics.text import distinct_n, repeated_ngram_rate

__all__ = ["perplexity", "nll", "bits_per_byte", "cache_logits", "kl_to_reference", "top1_agreement", "repeated_ngram_rate", "distinct_n",
           "quality", "reference_logits", "scored_logits"]
