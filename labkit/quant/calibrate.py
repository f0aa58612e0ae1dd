"""GPTQ and AWQ over a whole model, block by block, from calibration token ids.

The model is a labkit `Transformer` or anything with the same module names (`layers[i]`
with `attn_norm`, `attn.wqkv`, `attn.wo`, `ffn_norm`, `mlp.w_gate_up`, `mlp.w_down`; a final
`norm`; `tok_embeddings`); this layer imports no model code. `BlockWalk` carries the
calibration activations from block to block (one pass through each block, as the papers'
code does), and hooks on each block's linear layers collect their inputs; `block_inputs`
gets one block's inputs on its own, by running the model up to it.

- GPTQ (as in the paper's code): blocks before i are already quantized, so block i sees
  the inputs the quantized model will give it; each linear layer gets its Hessian and is
  quantized column by column.
- AWQ (as in the paper's code): scales are searched and folded block by block in float, so
  every block sees the float model's inputs (folding changes nothing in float); rounding
  happens at the end, with RTN on the scaled weights.
"""
from __future__ import annotations

import torch
from torch import nn

from labkit.quant.awq import awq_search
from labkit.quant.gptq import gptq_quantize, hessian

__all__ = ["block_inputs", "BlockWalk", "gptq_blocks", "awq_blocks", "head_inputs"]


class _Stop(Exception):
    pass


def _linears(block: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in block.named_modules() if isinstance(m, nn.Linear)]


def _collect_hooks(block: nn.Module, keep: str, found: dict) -> list:
    """Hooks on the block's linear layers gathering their Hessian sums (`keep="hessian"`) or inputs ("inputs")."""
    if keep not in ("hessian", "inputs"):
        raise ValueError(f"keep must be 'hessian' or 'inputs', got {keep!r}")

    def collect(name):
        def hook(module, args):
            x = args[0].reshape(-1, args[0].shape[-1]).detach()
            if keep == "hessian":
                acc = found.setdefault(name, [0.0, 0])
                acc[0] = acc[0] + x.double().t() @ x.double()
                acc[1] += x.shape[0]
            else:
                found.setdefault(name, []).append(x.float())
        return hook

    return [m.register_forward_pre_hook(collect(name)) for name, m in _linears(block)]


def _finish(found: dict, keep: str) -> dict[str, torch.Tensor]:
    if keep == "hessian":
        return {name: 2.0 / n * s for name, (s, n) in found.items()}
    return {name: torch.cat(xs) for name, xs in found.items()}


@torch.no_grad()
def block_inputs(model, calib: torch.Tensor, i: int, keep: str = "hessian") -> dict[str, torch.Tensor]:
    """Per linear layer of block i: its Hessian 2/n·XᵀX (`keep="hessian"`) or its inputs X [n, in] ("inputs")."""
    block = model.layers[i]
    found: dict[str, list] = {}

    def stop(module, args, output):
        raise _Stop

    hooks = _collect_hooks(block, keep, found)
    hooks.append(block.register_forward_hook(stop))
    try:
        model(calib)
    except _Stop:
        pass
    finally:
        for h in hooks:
            h.remove()
    return _finish(found, keep)


class BlockWalk:
    """The calibration activations carried from block to block, one pass per block instead of one per prefix.

    `first = BlockWalk(model, calib)` captures what enters block 0 (embeddings, RoPE,
    positions); `walk.inputs(i, keep)` runs block i once on what entered it, with hooks on
    its linear layers; `walk.advance(i)` runs block i as it now is (quantized or rescaled)
    to get what enters block i + 1. Blocks see the earlier blocks' outputs as they are after
    their own quantization (GPTQ) or folding (AWQ), as in the papers' code.
    """

    @torch.no_grad()
    def __init__(self, model, calib: torch.Tensor):
        got = {}

        def grab(module, args):
            got["args"] = args
            raise _Stop

        hook = model.layers[0].register_forward_pre_hook(grab)
        try:
            model(calib)
        except _Stop:
            pass
        finally:
            hook.remove()
        self.model, (self.x, *self.rest) = model, got["args"]

    @torch.no_grad()
    def inputs(self, i: int, keep: str = "hessian") -> dict[str, torch.Tensor]:
        found: dict[str, list] = {}
        hooks = _collect_hooks(self.model.layers[i], keep, found)
        try:
            self.model.layers[i](self.x, *self.rest)
        finally:
            for h in hooks:
                h.remove()
        return _finish(found, keep)

    @torch.no_grad()
    def advance(self, i: int) -> None:
        self.x = self.model.layers[i](self.x, *self.rest)


@torch.no_grad()
def head_inputs(model, calib: torch.Tensor) -> torch.Tensor:
    """The final norm's output for the calibration ids: the LM head's input [n, d_model]."""
    got = []
    hook = model.norm.register_forward_hook(lambda m, a, out: got.append(out.reshape(-1, out.shape[-1]).float()))
    try:
        model(calib)
    finally:
        hook.remove()
    return torch.cat(got)


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, new)


def gptq_blocks(model, calib, make_layer, bits, group_size, symmetric, damp, act_order, include_head, progress=None):
    """Quantize every block's linear layers with GPTQ, in order (`make_layer(qt) -> module`)."""
    walk = BlockWalk(model, calib)
    for i, block in enumerate(model.layers):
        hessians = walk.inputs(i, keep="hessian")
        for name, m in _linears(block):
            qt = gptq_quantize(m.weight.detach(), hessians[name], bits, group_size, symmetric, damp, act_order=act_order)
            _replace(block, name, make_layer(qt))
        walk.advance(i)
        if progress is not None:
            progress(i)
    if include_head:
        x = head_inputs(model, calib)
        head = model.tok_embeddings.weight if model.lm_head is None else model.lm_head.weight
        model.lm_head = make_layer(gptq_quantize(head.detach(), hessian(x), bits, group_size, symmetric, damp,
                                                 act_order=act_order))


@torch.no_grad()
def _fold(prev_rows: torch.Tensor, weight: torch.Tensor, s: torch.Tensor) -> None:
    """x/s comes from dividing what produces x (`prev_rows`: a norm gain, or matrix rows) by s; W gets ·s."""
    prev_rows.div_(s.view(-1, *([1] * (prev_rows.dim() - 1))))
    weight.mul_(s[None, :])


def awq_blocks(model, calib, bits, group_size, symmetric, include_head, progress=None) -> dict:
    """Search and fold AWQ scales for every block (and the head); returns the chosen α per layer."""
    alphas = {}
    walk = BlockWalk(model, calib)
    for i, block in enumerate(model.layers):
        xs = walk.inputs(i, keep="inputs")
        attn, mlp = block.attn, block.mlp
        s, alphas[f"{i}.wqkv"], _ = awq_search(attn.wqkv.weight.detach(), xs["attn.wqkv"], bits, group_size, symmetric)
        _fold(block.attn_norm.weight.data, attn.wqkv.weight.data, s)
        s, alphas[f"{i}.w_gate_up"], _ = awq_search(mlp.w_gate_up.weight.detach(), xs["mlp.w_gate_up"], bits, group_size, symmetric)
        _fold(block.ffn_norm.weight.data, mlp.w_gate_up.weight.data, s)
        s, alphas[f"{i}.w_down"], _ = awq_search(mlp.w_down.weight.detach(), xs["mlp.w_down"], bits, group_size, symmetric)
        _fold(mlp.w_gate_up.weight.data[mlp.ffn_dim:], mlp.w_down.weight.data, s)  # the "up" rows make x
        if attn.n_heads == attn.n_kv_heads:  # with GQA a value channel feeds several heads: no per-channel fold
            q_out, kv_out, _ = attn.split
            s, alphas[f"{i}.wo"], _ = awq_search(attn.wo.weight.detach(), xs["attn.wo"], bits, group_size, symmetric)
            _fold(attn.wqkv.weight.data[q_out + kv_out:], attn.wo.weight.data, s)
        walk.advance(i)
        if progress is not None:
            progress(i)
    if include_head:
        x = head_inputs(model, calib)
        if model.lm_head is None:  # a tied head gets its own copy, so scaling it leaves the embedding alone
            model.lm_head = nn.Linear(x.shape[1], model.tok_embeddings.weight.shape[0], bias=False)
            model.lm_head.weight.data.copy_(model.tok_embeddings.weight.data)
        s, alphas["lm_head"], _ = awq_search(model.lm_head.weight.detach(), x, bits, group_size, symmetric)
        _fold(model.norm.weight.data, model.lm_head.weight.data, s)
    return alphas
