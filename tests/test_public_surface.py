"""Every name of the public surface (design: "The public surface") is importable where it is promised."""
import importlib

import pytest

SURFACE = [
    "labkit.load", "labkit.available_models", "labkit.generate", "labkit.stream", "labkit.prefill", "labkit.decode",
    "labkit.PrefillState", "labkit.GenerationOutput",
    "labkit.tokenizer.BPETokenizer", "labkit.tokenizer.from_gguf", "labkit.tokenizer.get_tokenizer",
    "labkit.model.ModelConfig", "labkit.model.ModelConfig.from_name", "labkit.model.Transformer",
    "labkit.model.Transformer.new_cache",
    "labkit.kvcache.KVCache", "labkit.kvcache.new_cache", "labkit.kvcache.kinds", "labkit.kvcache.memory_rows",
    "labkit.sampling.process_logits", "labkit.sampling.beam_search", "labkit.sampling.SamplingParams",
    "labkit.sampling.StopStrings", "labkit.sampling.sample_next",
    "labkit.generation.decode_with_checkpoints",
    "labkit.costmodel.estimate", "labkit.costmodel.hardware", "labkit.costmodel.HARDWARE", "labkit.costmodel.Estimate",
    "labkit.power.simulate", "labkit.power.Timeline",
    "labkit.metrics.perplexity", "labkit.metrics.kl_to_reference", "labkit.metrics.top1_agreement",
    "labkit.metrics.repeated_ngram_rate",
    "labkit.data.data_path", "labkit.quant.ggml.quantize", "labkit.quant.ggml.dequantize",
    "labkit.viz.token_boundaries_html", "labkit.viz.reply_timeline", "labkit.widgets.token_boundaries",
    "labkit.exercises.check_rope_half", "labkit.exercises.check_mixed_cache_bytes",
]


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("name", SURFACE)
def test_public_name_resolves(name):
    assert callable(_resolve(name)) or _resolve(name) is not None


def test_public_callables_are_functions_not_modules():
    """A submodule must never shadow a public function of the same name (labkit.costmodel.estimate, ...)."""
    import types

    for name in ["labkit.generate", "labkit.costmodel.estimate", "labkit.costmodel.hardware", "labkit.power.simulate",
                 "labkit.metrics.perplexity", "labkit.sampling.beam_search"]:
        assert not isinstance(_resolve(name), types.ModuleType), name


def test_every_package_hands_on_what_its_all_lists():
    import pkgutil

    import labkit

    for info in pkgutil.iter_modules(labkit.__path__):
        if info.ispkg:
            mod = importlib.import_module(f"labkit.{info.name}")
            for n in getattr(mod, "__all__", []):
                assert hasattr(mod, n), f"labkit.{info.name}.__all__ lists {n!r}, which it does not define"
