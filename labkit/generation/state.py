"""Checkpoints between the two stages: save a `PrefillState`, resume decoding later.

Everything decoding needs goes into one safetensors file (no pickle, so loading a file
cannot run code): the KV cache's tensors, the next-token logits, the token history and
the sampler's RNG state; a JSON header says which model made it (name and a fingerprint
of its weights), which cache kind with which options, and the position. Resuming from
the file gives the same tokens as never stopping, seeded sampling included. Saving
every few tokens (`decode_with_checkpoints`) is the "periodic KV persistence for fault
recovery" of serving systems: after a crash, decoding restarts from the last file
instead of re-running the prompt.

    >>> state = labkit.prefill(model, ids)                     # doctest: +SKIP
    >>> state.save("prompt.safetensors")                        # doctest: +SKIP
    >>> state = labkit.PrefillState.load("prompt.safetensors", model)   # doctest: +SKIP
    >>> labkit.decode(model, state, 16)                         # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from labkit.data.headers import read_header

__all__ = ["save_state", "load_state", "describe", "model_fingerprint", "model_info", "PrefillState", "FORMAT"]

FORMAT = "labkit.prefill_state/1"


@dataclass
class PrefillState:
    """Everything decoding needs to continue: the KV cache, the position, the next-token
    logits, the token history (for penalties) and the sampler's RNG state."""

    cache: object
    position: int  # tokens processed so far (the next token's position)
    logits: torch.Tensor  # float32 [vocab_size]: distribution of the next token
    history: list[int] = field(default_factory=list)  # prompt + generated ids
    rng_state: torch.Tensor | None = None  # torch.Generator state; None until seeded
    seed: int | None = 0
    model_info: dict | None = None  # name and weight fingerprint of the model that made it (for load)

    def save(self, path) -> Path:
        """Write this state to one safetensors file, to resume later (see `labkit.generation.state`)."""
        return save_state(self, path)

    @classmethod
    def load(cls, path, model) -> "PrefillState":
        """Read a saved state for `model` (ValueError, naming both, if another model saved it)."""
        return load_state(path, model)



def model_fingerprint(model) -> str:
    """A short hash of the model's config, dtype and a sample of its weights."""
    h = hashlib.sha256(json.dumps(model.config.identity(), sort_keys=True, default=str).encode())
    h.update(str(model.dtype).encode())
    with torch.no_grad():
        for t in (model.tok_embeddings.weight[:8], model.norm.weight, model.layers[0].attn.wqkv.weight[:8]):
            h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def model_info(model) -> dict:
    """{name, fingerprint, dtype} of `model`, recorded in every PrefillState."""
    return {"name": model.config.name, "fingerprint": model_fingerprint(model), "dtype": str(model.dtype).replace("torch.", "")}


# ---- cache <-> tensors --------------------------------------------------------------

def _cache_state(cache) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """(tensors, meta, constructor options) for any cache kind that can be saved."""
    if not cache.supports("state_tensors"):
        raise TypeError(f"cannot save a {type(cache).__name__}: it has no state_tensors() method")
    tensors, meta = cache.state_tensors()
    return tensors, meta, cache.options()


# ---- the file -----------------------------------------------------------------------

def save_state(state, path: str | Path, model=None) -> Path:
    """Write `state` (a PrefillState) to `path` (one .safetensors file); return the path.

    `model` (optional) records which model made the state; without it the cache's
    config is recorded and `load_state` checks that instead.
    """
    from safetensors.torch import save_file

    if state.cache is None:
        raise ValueError("this PrefillState has no KV cache to save")
    if getattr(state.cache, "_n_new", None) is not None:
        raise RuntimeError("cannot save a cache in the middle of a forward pass")
    cache_tensors, cache_meta, options = _cache_state(state.cache)
    tensors = {f"cache.{k}": v for k, v in cache_tensors.items()}
    tensors["logits"] = state.logits
    tensors["history"] = torch.tensor(state.history, dtype=torch.long)
    if state.rng_state is not None:
        tensors["rng_state"] = state.rng_state
    info = model_info(model) if model is not None else state.model_info
    header = {
        "format": FORMAT,
        "model": info or {"name": state.cache.config.name, "fingerprint": None, "dtype": str(state.cache.dtype).replace("torch.", "")},
        "config": state.cache.config.identity(),
        "cache": {"kind": state.cache.kind, "options": options, "meta": cache_meta},
        "position": state.position,
        "seed": state.seed,
    }
    path = Path(path)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    save_file(tensors, str(path), metadata={"labkit": json.dumps(header, default=str)})
    return path


def describe(path: str | Path) -> dict:
    """The JSON header of a saved state: model, cache kind and options, position, seed."""
    return read_header(path, FORMAT, "saved labkit PrefillState")


def _check_model(header: dict, model, path) -> None:
    saved, here = header["model"], model_info(model)
    same_config = header["config"] == json.loads(json.dumps(model.config.identity(), default=str))
    same_weights = saved["fingerprint"] is None or saved["fingerprint"] == here["fingerprint"]
    if not (same_config and same_weights and saved["dtype"] == here["dtype"]):
        raise ValueError(
            f"{path} was saved from model {saved['name']!r} (fingerprint {saved['fingerprint']}, {saved['dtype']}) "
            f"and cannot be loaded into model {here['name']!r} (fingerprint {here['fingerprint']}, {here['dtype']}): "
            "a KV cache only means something to the model that computed it")


def load_state(path: str | Path, model):
    """Read a state written by `save_state` for `model`; raises ValueError for another model."""
    from safetensors import safe_open

    header = describe(path)
    _check_model(header, model, path)
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k).to(model.device) for k in f.keys()}
    spec = header["cache"]
    cache = model.new_cache(kind=spec["kind"], **spec["options"])
    cache.load_state_tensors({k[len("cache."):]: v for k, v in tensors.items() if k.startswith("cache.")}, spec["meta"])
    if cache.seq_len != header["position"]:
        raise ValueError(f"{path}: the cache holds {cache.seq_len} tokens but the state's position is {header['position']}")
    rng = tensors.get("rng_state")
    state = PrefillState(cache=cache, position=header["position"], logits=tensors["logits"],
                         history=tensors["history"].tolist(), rng_state=None if rng is None else rng.cpu(),
                         seed=header["seed"])
    return state
