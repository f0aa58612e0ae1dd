"""Compressed sparse attention: a layer whose cache holds about one entry per m tokens.

Built in the spirit of DeepSeek-V4's Compressed Sparse Attention (CSA; DeepSeek-AI 2026,
"DeepSeek-V4: Towards Highly Efficient Million-Token Context Intelligence", section 2.3), at the
lab's scale. A query at position t attends, in one softmax, to

  * **a window**: itself and the `csa_window - 1` tokens before it, keys and values as a dense
    layer makes them (rotated keys);
  * **the top-k compressed entries**: every `csa_block` = m consecutive tokens (a block) are
    merged into one entry that is both key and value (V4's shared-KV entries). Each token
    proposes a candidate c = W_c·x and a logit per channel z = W_z·x + b[slot]; the entry is
    Σ softmax(z) ⊙ c over the block's m tokens, channel by channel. As a key it is rotated at
    the block's last position; as a value it is used as stored. A query sees the blocks that
    end at or before it, and of those only the `csa_topk` its indexer scores highest;
  * **the indexer** (DeepSeek-V3.2's lightning indexer): I(t, j) = Σ_h w_{t,h} · relu(q^I_{t,h} · k^I_j)
    over `csa_index_heads` small heads of width `csa_index_dim`; k^I_j is the mean of the block's
    index keys. Top-k selection has no gradient, so the indexer learns on its own: its input is
    detached and its loss (`aux_loss`, set by a training forward and added by the training loop) is
    the KL divergence from the main heads' attention over all visible compressed entries (averaged
    over heads) to softmax(I): V3.2's warm-up target, used throughout. (One optimizer and one global
    gradient clip serve all parameters, the indexer's included.)

What the cache keeps per layer (`labkit.kvcache.compressed`): the window's last w − 1 keys and
values, one entry and one index key per finished block, and the candidates, logits and index
keys of the block being filled (fewer than m tokens). At 1,024 tokens that is about a fifth of a
dense layer's keys and values (`labkit bench --only kvcache` and chapter 04 count it).

    >>> cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64,
    ...                   csa_block=4, csa_topk=2, csa_window=8, csa_index_heads=2, csa_index_dim=8)
    >>> from labkit.model.transformer import Transformer
    >>> Transformer(cfg)(torch.tensor([[1, 2, 3, 4, 5]])).shape
    torch.Size([1, 5, 50])
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from labkit.model.config import ModelConfig
from labkit.model.kernels import Linear

__all__ = ["CompressedAttention", "block_entries", "index_scores", "select_entries"]


def block_entries(rows: torch.Tensor, slot_bias: torch.Tensor, m: int, kv_out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge whole blocks of m token rows [B, n·m, c | z | u] into (entries [B, n, kv_out], index keys [B, n, index_dim]).

    c: the candidates, z: their logits per channel (the slot bias b [m, kv_out] is added here),
    u: the index keys. Entry = Σ softmax_over_slots(z + b) ⊙ c; index key = mean of u.
    """
    B, n_rows, width = rows.shape
    blocks = rows.view(B, n_rows // m, m, width)
    c, z, u = blocks.split([kv_out, kv_out, width - 2 * kv_out], dim=-1)
    weights = (z + slot_bias).softmax(dim=2)  # over the m slots, channel by channel
    return (weights * c).sum(2), u.mean(2)


def index_scores(iq: torch.Tensor, iw: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """I(t, j) = Σ_h w_{t,h} · relu(q_{t,h} · k_j): iq [B, T, h, d], iw [B, T, h], keys [B, N, d] -> [B, T, N]."""
    return (torch.einsum("bthd,bnd->bthn", iq, keys).relu() * iw.unsqueeze(-1)).sum(2)


def select_entries(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k visible entries per query: (indices [B, T, k], chosen mask [B, T, N]); ties go to the lower index.

    k = min(topk, N). Where a query sees fewer than k entries, `indices` also lists invisible ones;
    `chosen` is the mask to use (a decode step sees every entry, so its indices are all chosen).
    """
    k = min(topk, scores.shape[-1])
    masked = scores.masked_fill(~visible, float("-inf"))
    top = masked.sort(dim=-1, descending=True, stable=True).indices[..., :k]  # stable: equal scores keep index order
    chosen = torch.zeros_like(masked, dtype=torch.bool).scatter_(-1, top, True) & visible
    return top, chosen


class CompressedAttention(nn.Module):
    """The attention of a compressed-attention layer (see the module docstring); the shapes of `Attention`."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        H, Hkv, D = config.n_heads, config.n_kv_heads, config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, Hkv, D
        self.m, self.topk, self.window = config.csa_block, config.csa_topk, config.csa_window
        self.index_heads, self.index_dim = config.csa_index_heads, config.csa_index_dim
        self.kv_out = Hkv * D
        self.split = (H * D, self.kv_out, self.kv_out)
        self.wqkv = Linear(config.d_model, H * D + 2 * self.kv_out)  # the window's queries, keys and values
        self.wo = Linear(H * D, config.d_model)
        self.w_compress = Linear(config.d_model, 2 * self.kv_out)  # rows: [W_c; W_z]
        self.slot_bias = nn.Parameter(torch.zeros(self.m, self.kv_out))
        self.w_index = Linear(config.d_model, config.index_width)  # rows: index queries, head weights, index key
        self.aux_loss = None  # the indexer's loss of the last training forward

    def projections(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.wqkv.weight.split(self.split, dim=0)

    def forward(self, x: torch.Tensor, rope, positions: torch.Tensor, cache=None, batch: int = 1) -> torch.Tensor:
        if x.dim() == 3:
            return self.forward(x.reshape(-1, x.shape[-1]), rope, positions, cache, x.shape[0]).view(x.shape)
        if cache is not None and getattr(cache, "kind", None) != "compressed":
            raise ValueError(f"a compressed-attention model needs a cache of kind 'compressed' "
                             f"(model.new_cache()), got {getattr(cache, 'kind', type(cache).__name__)!r}")
        H, Hkv, D, B = self.n_heads, self.n_kv_heads, self.head_dim, batch
        T = x.shape[0] // B
        self.aux_loss = None
        qkv = self.wqkv(x).view(B, T, H + 2 * Hkv, D)
        qk = rope.rotate_tokens(qkv[:, :, :H + Hkv], positions)
        q, k, v = qk[:, :, :H], qk[:, :, H:], qkv[:, :, H + Hkv:]
        ih, idim = self.index_heads, self.index_dim
        ix = self.w_index(x.detach() if torch.is_grad_enabled() else x).view(B, T, -1)
        iq, iw, iu = ix.split([ih * idim, ih, idim], dim=-1)
        rows = torch.cat([self.w_compress(x).view(B, T, -1), iu], dim=-1)  # [B, T, c | z | u]
        if cache is None:
            start, win_k, win_v = 0, k.new_zeros(B, Hkv, 0, D), v.new_zeros(B, Hkv, 0, D)
            pending, entries, ikeys = rows[:, :0], k.new_zeros(B, 0, self.kv_out), k.new_zeros(B, 0, idim)
        else:
            start = cache.seq_len
            win_k, win_v, pending, entries, ikeys = cache.layer_state(self.layer)
        stream = torch.cat([pending, rows], dim=1)  # the unfinished block's rows, then this pass's
        n_done = stream.shape[1] // self.m * self.m
        new_entries, new_ikeys = block_entries(stream[:, :n_done], self.slot_bias, self.m, self.kv_out)
        entries, ikeys = torch.cat([entries, new_entries], 1), torch.cat([ikeys, new_ikeys], 1)
        keys_w = torch.cat([win_k, k.transpose(1, 2)], 2)  # [B, Hkv, n_win + T, D]
        values_w = torch.cat([win_v, v.transpose(1, 2)], 2)
        out = self._attend(q, keys_w, values_w, entries, ikeys, iq.view(B, T, ih, idim), iw, start, rope, positions)
        if cache is not None:
            keep = self.window - 1
            cache.store(self.layer, keys_w[:, :, -keep:], values_w[:, :, -keep:], stream[:, n_done:], new_entries, new_ikeys)
        return self.wo(out)

    def _attend(self, q, keys_w, values_w, entries, ikeys, iq, iw, start, rope, positions):
        """One softmax over the window and the chosen entries: q [B, T, H, D] -> [B·T, H·D]."""
        B, T, H, D = q.shape
        Hkv, n_win, N = self.n_kv_heads, keys_w.shape[2], entries.shape[1]
        n_prior = n_win - T
        ends = (torch.arange(1, N + 1, device=q.device) * self.m - 1)  # each entry's last position
        scores = index_scores(iq, iw, ikeys)  # [B, T, N]
        visible = ends <= positions[:, None]  # [T, N]
        top, chosen = select_entries(scores, visible.expand(B, T, N), self.topk)
        if self.training and torch.is_grad_enabled() and N:
            self.aux_loss = self._index_loss(q, entries, ends, scores, visible, rope)
        if T == 1:  # a decode step sees every entry that exists: gather the chosen ones, no mask
            picked = entries.gather(1, top[:, 0, :, None].expand(B, top.shape[-1], self.kv_out))  # [B, k, kv_out]
            ckeys = rope.rotate_tokens(picked.view(B, -1, Hkv, D), ends[top[0, 0]]) if B == 1 else None
            if ckeys is None:  # rows of a batch chose different entries: rotate each at its own ends
                ckeys = torch.stack([rope.rotate_tokens(picked[b:b + 1].view(1, -1, Hkv, D), ends[top[b, 0]])[0]
                                     for b in range(B)])
            keys = torch.cat([keys_w, ckeys.transpose(1, 2)], 2)
            values = torch.cat([values_w, picked.view(B, -1, Hkv, D).transpose(1, 2)], 2)
            out = F.scaled_dot_product_attention(q.view(B, Hkv, H // Hkv, D), keys, values)  # GQA: heads of a group as rows
            return out.reshape(B, H * D)
        win_pos = torch.arange(start - n_prior, start + T, device=q.device)
        near = (win_pos <= positions[:, None]) & (win_pos > positions[:, None] - self.window)  # [T, n_win]
        ckeys = rope.rotate_tokens(entries.view(B, N, Hkv, D), ends).transpose(1, 2)
        keys = torch.cat([keys_w, ckeys], 2)
        values = torch.cat([values_w, entries.view(B, N, Hkv, D).transpose(1, 2)], 2)
        mask = torch.cat([near.expand(B, T, n_win), chosen], -1).unsqueeze(1)  # [B, 1, T, n_win + N]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=H != Hkv)
        return out.transpose(1, 2).reshape(B * T, H * D)

    def _index_loss(self, q, entries, ends, scores, visible, rope):
        """KL(main heads' attention over the visible entries, averaged over heads ‖ softmax of the index scores)."""
        B, T, H, D = q.shape
        rows = visible.any(-1)  # queries that see at least one entry
        if not bool(rows.any()):
            return None
        with torch.no_grad():
            ckeys = rope.rotate_tokens(entries.detach().view(B, -1, self.n_kv_heads, D), ends)  # [B, N, Hkv, D]
            ckeys = ckeys.repeat_interleave(H // self.n_kv_heads, dim=2)
            logits = torch.einsum("bthd,bnhd->bthn", q.detach(), ckeys).float() / D ** 0.5
            target = logits.masked_fill(~visible[:, None], float("-inf")).softmax(-1).mean(2)[:, rows]  # [B, T', N]
        log_p = scores.float().masked_fill(~visible, float("-inf")).log_softmax(-1)[:, rows]
        log_p = log_p.masked_fill(~visible[rows], 0.0)
        return F.kl_div(log_p, target, reduction="sum") / (B * int(rows.sum()))
