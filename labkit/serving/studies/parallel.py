"""Serving one model on several processes: tensor parallelism, disaggregated prefill, data parallelism.

Three ways to spend two workers on one model, each run for real on two processes that
talk through `torch.distributed` (gloo, on this machine's loopback; see
`labkit.serving.studies._dist`):

* **Tensor parallelism** (`shard`, `run_tensor_parallel`), Megatron-LM's scheme (Shoeybi
  et al. 2019): every weight matrix of a block is cut in `world` pieces, so each rank reads
  1/world of the weights per token and keeps 1/world of the KV cache. The price is two
  all-reduces per block, on the critical path of every token.
* **Disaggregated prefill** (`run_disaggregated`), as in Splitwise and DistServe: one worker
  runs the prompt (compute-bound), ships its KV cache to another that decodes (bandwidth-
  bound). The price is the transfer: 2 · n_layers · n_kv_heads · head_dim · bytes per
  prompt token, once per request.
* **Data parallelism** (`run_data_parallel`): whole replicas, each serving its share of
  the requests. No communication at all; the price is a full copy of the weights per replica.

    >>> out = run_tensor_parallel("shakespeare", [1, 2, 3], n_new=4)      # doctest: +SKIP
    >>> out["ids"], out["allreduce_s_per_step"]                            # doctest: +SKIP
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
from torch import nn

from labkit import checks
from labkit.measure.clock import now as clock_now
from labkit.model.transformer import Transformer, linear
from labkit.serving.studies._dist import check_request, decode_greedy, launch, load_named, prefill_last

__all__ = ["AllReduceLinear", "shard", "all_reduce_stats", "run_tensor_parallel", "run_disaggregated",
           "run_data_parallel"]


class AllReduceLinear(nn.Module):
    """A row-parallel linear: `x @ W_r.T` on this rank's input columns, then a sum over the ranks.

    Each rank holds the columns of W that match the slice of the input it computed, so its
    product is a partial sum of the full output; `dist.all_reduce` adds the partials and
    leaves the full [B, T, d_model] output on every rank. The seconds, the number of calls
    and the bytes summed are counted here (`all_reduce_stats`); the seconds include waiting
    for the slowest rank to arrive. A ring all-reduce moves 2 · (world − 1) / world of those
    bytes in and out of every rank.
    """

    def __init__(self, weight: torch.Tensor, reduce: bool = True):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [d_model, in_features / world]
        self.reduce = reduce  # False: leave the partial sum (to check the maths in one process)
        self.seconds, self.count, self.bytes = 0.0, 0, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = linear(x, self.weight).contiguous()  # [B, T, d_model]: this rank's partial sum
        if self.reduce:
            t0 = clock_now()
            dist.all_reduce(out, op=dist.ReduceOp.SUM)
            self.seconds += clock_now() - t0
            self.count += 1
            self.bytes += out.numel() * out.element_size()
        return out


def _check_shard(model, rank, world) -> None:
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a labkit Transformer, got {type(model).__name__}")
    checks.positive_int("world", world)
    checks.integer("rank", rank, 0, world - 1, why=f"world={world}")
    cfg = model.config
    if cfg.compressed_attention:
        raise ValueError(f"{cfg.name!r} has compressed attention (csa_block > 0): tensor parallelism here splits dense "
                         f"attention layers only")
    for field in ("n_heads", "n_kv_heads", "ffn_dim"):
        if getattr(cfg, field) % world:
            raise ValueError(f"{field}={getattr(cfg, field)} of {cfg.name!r} is not divisible by world={world}: "
                             f"tensor parallelism gives every rank the same share; use a world that divides it")
    block = model.layers[0]
    if not isinstance(getattr(block.attn.wqkv, "weight", None), nn.Parameter):
        raise TypeError("shard needs plain (float) weights; this model's linears are packed")


def _rows(w: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's block of rows of w [out, in]: output features (column-parallel)."""
    n = w.shape[0] // world
    return w[rank * n:(rank + 1) * n]


def _cols(w: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's block of columns of w [out, in]: input features (row-parallel)."""
    n = w.shape[1] // world
    return w[:, rank * n:(rank + 1) * n].contiguous()


@torch.no_grad()
def shard(model: Transformer, rank: int, world: int, *, reduce: bool = True) -> Transformer:
    """Rank `rank`'s tensor-parallel shard of `model`: a Transformer with 1/world of each block.

    Megatron-LM's scheme (Shoeybi et al. 2019), per block:

    * attention: the QKV projection is column-parallel. Rank r keeps query heads
      [r·n_heads/world, (r+1)·n_heads/world) and KV heads [r·n_kv_heads/world, ...): with
      grouped-query attention query head h reads KV head h // group_size, so cutting both
      by whole heads keeps every group on one rank, and the rank attends on its own (no
      communication inside attention). Its KV cache holds only its KV heads: 1/world of the
      memory. `wo` is row-parallel (the input columns of those query heads), then all-reduce.
    * MLP: the gate and up rows are column-parallel (ffn_dim/world of each: SiLU(gate)·up is
      elementwise, so it runs on the slice), `w_down` row-parallel, then all-reduce.

    So two all-reduces of [B, T, d_model] per block, one after attention and one after the
    MLP: 2 · n_layers per forward pass. The embedding, the norms and the LM head are
    replicated (every rank computes the same logits). The shard's config has n_heads,
    n_kv_heads and ffn_dim divided by world, head_dim unchanged. `reduce=False` leaves the
    row-parallel outputs as partial sums, for checking the slicing without processes:
    summed over the ranks they equal the full model's.
    Raises ValueError when world does not divide n_heads, n_kv_heads or ffn_dim.
    """
    _check_shard(model, rank, world)
    cfg = model.config
    part = Transformer(cfg.replace(n_heads=cfg.n_heads // world, n_kv_heads=cfg.n_kv_heads // world,
                                   ffn_dim=cfg.ffn_dim // world, head_dim=cfg.head_dim))
    part.to(dtype=model.dtype, device=model.device).eval().requires_grad_(False)
    part.tok_embeddings.weight.copy_(model.tok_embeddings.weight)  # replicated: [V, d_model]
    part.norm.weight.copy_(model.norm.weight)
    if model.lm_head is not None:
        part.lm_head.weight.copy_(model.lm_head.weight)
    on = world > 1 and reduce
    for full, mine in zip(model.layers, part.layers):
        mine.attn_norm.weight.copy_(full.attn_norm.weight)
        mine.ffn_norm.weight.copy_(full.ffn_norm.weight)
        wq, wk, wv = full.attn.projections()  # [n_heads·hd, d], [n_kv·hd, d], [n_kv·hd, d]: rows grouped by head
        mine.attn.wqkv.weight.copy_(torch.cat([_rows(w, rank, world) for w in (wq, wk, wv)]))
        mine.attn.wo = AllReduceLinear(_cols(full.attn.wo.weight, rank, world), on)  # [d, n_heads·hd/world]
        gate, up = full.mlp.w_gate_up.weight.split(cfg.ffn_dim)  # [ffn, d] each
        mine.mlp.w_gate_up.weight.copy_(torch.cat([_rows(gate, rank, world), _rows(up, rank, world)]))
        mine.mlp.w_down = AllReduceLinear(_cols(full.mlp.w_down.weight, rank, world), on)  # [d, ffn/world]
    if model.layers[0].attn.wqkv.weight.stride(0) == 1:
        part.column_major_()  # the layout the source was loaded in (fast one-token products)
    return part


def all_reduce_stats(model: nn.Module) -> dict:
    """Totals over a shard's all-reduces so far: seconds, count, bytes (each rank's payload)."""
    mods = [m for m in model.modules() if isinstance(m, AllReduceLinear)]
    return {"seconds": sum(m.seconds for m in mods), "count": sum(m.count for m in mods),
            "bytes": sum(m.bytes for m in mods)}


# ---- tensor parallelism ---------------------------------------------------------------


def _tp_worker(rank, world, model_name, prompt_ids, n_new):
    part = shard(load_named(model_name), rank, world)
    cache = part.new_cache(max_len=len(prompt_ids) + n_new)  # this rank's KV heads only
    logits, prefill_s = prefill_last(part, prompt_ids, cache)
    before = all_reduce_stats(part)
    ids, step_s = decode_greedy(part, cache, int(logits.argmax()), n_new)
    after = all_reduce_stats(part)
    steps = max(1, len(step_s))
    return {"prefill_logits": logits.tolist(), "ids": ids, "prefill_s": prefill_s, "step_s": step_s,
            "allreduce_s": after["seconds"], "allreduce_count": after["count"], "allreduce_bytes": after["bytes"],
            "allreduce_s_per_step": (after["seconds"] - before["seconds"]) / steps,
            "allreduce_alone_s": _allreduce_alone(part.config.d_model) if world > 1 else 0.0,
            "threads_per_rank": torch.get_num_threads(), "kv_bytes_per_rank": cache.bytes_used()}


def _allreduce_alone(d_model: int, n: int = 40) -> float:
    """Median seconds of one all-reduce of a token's activations [1, 1, d_model], back to back, nothing else
    running: the transport's own latency, without waiting for a rank still computing."""
    x, times = torch.zeros(1, 1, d_model), []
    dist.barrier()
    for _ in range(n):
        t0 = clock_now()
        dist.all_reduce(x)
        times.append(clock_now() - t0)
    return statistics.median(times)


def run_tensor_parallel(model_name: str = "shakespeare", prompt_ids: list[int] | None = None, n_new: int = 8,
                        world: int = 2, timeout_s: float = 120.0) -> dict:
    """Greedy generation on `world` tensor-parallel ranks (`shard`); rank 0's measurements.

    Every rank loads the model, keeps its shard, prefills `prompt_ids` (required) into its own
    cache and decodes: n_new tokens, the first from the prefill, then n_new − 1 one-token steps.
    The single-process reference is the same loop on the unsharded model, in this process.
    Returns: prefill_logits (float32 [V], last prompt position), ids, prefill_s, step_s
    (seconds of each decode step), step_s_median, allreduce_s, allreduce_count,
    allreduce_bytes (totals over prefill and decode), allreduce_s_per_step (decode only),
    allreduce_alone_s (one all-reduce of a token's activations with nothing else running, median),
    threads_per_rank (torch's intra-op threads: one, so two ranks fill two cores), kv_bytes_per_rank, world. RuntimeError if the ranks disagree on the ids.
    """
    check_request(model_name, [prompt_ids], n_new)
    outs = launch(_tp_worker, world, (model_name, list(prompt_ids), n_new), timeout_s)
    if any(o["ids"] != outs[0]["ids"] for o in outs):
        raise RuntimeError(f"the ranks generated different ids: {[o['ids'] for o in outs]}")
    out = dict(outs[0], world=world, prefill_logits=torch.tensor(outs[0]["prefill_logits"]))
    out["step_s_median"] = statistics.median(out["step_s"]) if out["step_s"] else 0.0
    return out


# ---- disaggregated prefill and decode -------------------------------------------------


def _disagg_worker(rank, world, model_name, prompt_ids, n_new):
    model = load_named(model_name)
    if rank == 0:  # the prefill worker
        cache = model.new_cache(max_len=len(prompt_ids))
        logits, prefill_s = prefill_last(model, prompt_ids, cache)
        n = cache.seq_len
        keys = cache.keys[..., :n, :].contiguous()  # [n_layers, B, n_kv_heads, n, head_dim], rotated
        values = cache.values[..., :n, :].contiguous()
        dist.barrier()  # the decoder is ready: its clock starts now
        t0 = clock_now()
        dist.send(torch.tensor([*keys.shape, int(logits.argmax())]), dst=1)  # header: shape + first token
        dist.send(keys, dst=1)
        dist.send(values, dst=1)
        return {"prefill_s": prefill_s, "send_s": clock_now() - t0,
                "kv_bytes": keys.numel() * keys.element_size() + values.numel() * values.element_size()}
    dist.barrier()
    t0 = clock_now()
    header = torch.empty(6, dtype=torch.long)
    dist.recv(header, src=0)
    shape, first = tuple(header[:5].tolist()), int(header[5])
    keys, values = torch.empty(shape, dtype=model.dtype), torch.empty(shape, dtype=model.dtype)
    dist.recv(keys, src=0)
    dist.recv(values, src=0)
    transfer_s = clock_now() - t0
    cache = model.new_cache(max_len=shape[3] + n_new, batch_size=shape[1])
    cache.begin(shape[3])  # write them through the cache's own protocol: one "pass" of the whole prompt
    for layer in range(shape[0]):
        cache.update(layer, keys[layer], values[layer], lambda k, positions: k)  # already rotated
    cache.end()
    ids, step_s = decode_greedy(model, cache, first, n_new)
    return {"ids": ids, "transfer_s": transfer_s, "decode_s": step_s}


def run_disaggregated(model_name: str = "shakespeare", prompt_ids: list[int] | None = None, n_new: int = 8,
                      timeout_s: float = 120.0) -> dict:
    """Prefill on rank 0, decode on rank 1; the KV cache crosses with `dist.send` / `dist.recv`.

    Rank 0 prefills `prompt_ids` (required), picks the first token and sends a header (the shape of the
    keys, and that token), then the committed keys and values of every layer,
    [n_layers, B, n_kv_heads, prompt_len, head_dim] each. Rank 1 writes them into its own
    cache and decodes the rest of the n_new tokens. A barrier after the prefill starts both
    clocks together, so the transfer time leaves the prefill out.
    Returns: ids, kv_bytes (2 · n_layers · n_kv_heads · head_dim · prompt_len · bytes per value),
    transfer_s (receiver, first recv to last), send_s (sender), prefill_s, decode_s (seconds of
    each decode step), decode_s_per_token, bandwidth_bytes_per_s (kv_bytes / transfer_s).
    """
    check_request(model_name, [prompt_ids], n_new)
    sender, receiver = launch(_disagg_worker, 2, (model_name, list(prompt_ids), n_new), timeout_s)
    out = {**sender, **receiver}
    out["decode_s_per_token"] = statistics.mean(out["decode_s"]) if out["decode_s"] else 0.0
    out["bandwidth_bytes_per_s"] = out["kv_bytes"] / out["transfer_s"] if out["transfer_s"] > 0 else float("inf")
    return out


# ---- data parallelism -----------------------------------------------------------------


def _dp_worker(rank, world, model_name, prompts, n_new):
    model = load_named(model_name)
    mine = list(range(rank, len(prompts), world))  # round-robin: prompt i goes to replica i % world
    dist.barrier()  # every replica loaded: the clocks start together
    t0 = clock_now()
    ids = {}
    for i in mine:  # one request after another, batch 1
        cache = model.new_cache(max_len=len(prompts[i]) + n_new)
        logits, _ = prefill_last(model, prompts[i], cache)
        ids[i], _ = decode_greedy(model, cache, int(logits.argmax()), n_new)
    return {"rank": rank, "prompts": mine, "ids": ids, "tokens": sum(len(v) for v in ids.values()),
            "wall_s": clock_now() - t0}


def run_data_parallel(model_name: str = "shakespeare", prompts: list[list[int]] | None = None, n_new: int = 8,
                      world: int = 2, timeout_s: float = 120.0) -> dict:
    """`world` whole replicas, each decoding its round-robin share of `prompts` (required), batch 1.

    Each replica loads the full model, waits at a barrier for the others, then serves its
    prompts one after another: n_new greedy tokens each. No communication while decoding.

    Returns: ids (one list per prompt, in the order given), tokens (all output tokens),
    wall_s (the slowest replica's), tokens_per_s (tokens / wall_s), replicas (per replica:
    rank, prompts (indices), tokens, wall_s), world.
    """
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of token-id lists, got {prompts!r}")
    check_request(model_name, prompts, n_new)
    outs = launch(_dp_worker, world, (model_name, [list(p) for p in prompts], n_new), timeout_s)
    by_prompt = {i: v for o in outs for i, v in o["ids"].items()}
    wall = max(o["wall_s"] for o in outs)
    tokens = sum(o["tokens"] for o in outs)
    return {"ids": [by_prompt[i] for i in range(len(prompts))], "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else float("inf"),
            "replicas": [{k: o[k] for k in ("rank", "prompts", "tokens", "wall_s")} for o in outs], "world": world}
