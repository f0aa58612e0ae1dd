"""Choice: sampling parameters and the logits pipeline, logits processors, stopping, beam search."""
from labkit.sampling.beam import BeamSearchOutput, beam_search
from labkit.sampling.pipeline import (ORDERS, SamplingParams, build_pipeline, make_generator, process_logits,
                                      process_stages, sample_next)
from labkit.sampling.stopping import StoppingCriteria, StopStrings

__all__ = ["SamplingParams", "ORDERS", "build_pipeline", "process_logits", "process_stages", "sample_next",
           "make_generator", "StopStrings", "StoppingCriteria", "beam_search", "BeamSearchOutput"]
