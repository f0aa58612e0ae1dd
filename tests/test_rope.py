"""RoPE: a rotation per pair, relative positions, and the two layouts related by the GGUF permutation."""
import pytest
import torch

from labkit.model.rope import Rotary, angles, apply_rope, permute_qk_rows, unpermute_qk_rows

D, BASE = 16, 10000.0


def _rot(layout, x, positions):
    return Rotary(D, BASE, 256, layout, dtype=x.dtype)(x, positions)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_fast_rotary_equals_the_textbook_form_and_keeps_norms(layout):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, D, generator=g)  # [B, H, T, head_dim]
    pos = torch.tensor([0, 1, 7, 100, 255])
    theta = angles(pos, D, BASE)
    ref = apply_rope(x.double(), theta.cos(), theta.sin(), layout)
    out = _rot(layout, x, pos)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out[..., 0, :], x[..., 0, :])  # position 0 is the identity


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_scores_depend_only_on_the_relative_position(layout):
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 1, 1, 1, D, generator=g, dtype=torch.float64)
    rope = Rotary(D, BASE, 512, layout, dtype=torch.float64)

    def score(m, n):
        return float((rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum())

    for m, n in [(0, 5), (3, 1), (10, 40)]:
        assert score(m, n) == pytest.approx(score(m + 200, n + 200), abs=1e-5)
    assert abs(score(0, 5) - score(0, 6)) > 1e-3  # but it does depend on the offset


def test_layouts_are_the_same_rotation_after_the_permutation():
    """rope_interleaved(P x) == P rope_half(x), where P maps half-layout dims to interleaved ones."""
    g = torch.Generator().manual_seed(2)
    n_heads = 3
    w_half = torch.randn(n_heads * D, 8, generator=g, dtype=torch.float64)  # a Q projection, HF layout
    w_inter = unpermute_qk_rows(w_half, n_heads)  # what llama.cpp writes into GGUF
    assert torch.equal(permute_qk_rows(w_inter, n_heads), w_half)  # inverse pair
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    pos = torch.arange(4)
    q_half = (x @ w_half.T).view(4, n_heads, D).transpose(0, 1)  # [heads, T, D]
    q_inter = (x @ w_inter.T).view(4, n_heads, D).transpose(0, 1)
    rot_half = Rotary(D, BASE, 16, "half", dtype=torch.float64)(q_half, pos)
    rot_inter = Rotary(D, BASE, 16, "interleaved", dtype=torch.float64)(q_inter, pos)
    # same vectors up to the per-head permutation of dimensions -> identical dot products
    torch.testing.assert_close(rot_inter @ rot_inter.transpose(-1, -2), rot_half @ rot_half.transpose(-1, -2), atol=1e-4, rtol=0)
    # the wrong combination (interleaved weights, half rotation) changes the scores: the classic silent bug
    wrong = Rotary(D, BASE, 16, "half", dtype=torch.float64)(q_inter, pos)
    k_half = Rotary(D, BASE, 16, "half", dtype=torch.float64)(q_half.roll(1, dims=1), pos)
    k_wrong = Rotary(D, BASE, 16, "half", dtype=torch.float64)(q_inter.roll(1, dims=1), pos)
    assert not torch.allclose(wrong @ k_wrong.transpose(-1, -2), rot_half @ k_half.transpose(-1, -2), atol=1e-3)


def test_permutation_moves_rows_as_documented():
    w = torch.arange(8.0)[:, None]  # one head of dim 8, row r holds r
    # interleaved row 2i+j -> half row j*4+i: rows 0,2,4,6 (first of each pair) come first
    assert permute_qk_rows(w, 1).flatten().tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_bad_layout():
    with pytest.raises(ValueError, match="layout must be one of"):
        Rotary(D, BASE, 8, "neox")


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_gathered_tables_follow_the_positions_tensor(layout):
    """The per-pass gather is reused only for the same positions tensor, never for new positions."""
    rope = Rotary(D, BASE, 64, layout)
    x = torch.randn(1, 2, 3, D, generator=torch.Generator().manual_seed(4))
    first, second = torch.tensor([1, 2, 3]), torch.tensor([10, 20, 30])
    a, b = rope(x, first), rope(x, second)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(b, Rotary(D, BASE, 64, layout)(x, second), atol=0, rtol=0)
    torch.testing.assert_close(rope(x, first), a, atol=0, rtol=0)
    assert rope.at(second, torch.float32) is rope.at(second, torch.float32)  # same tensor: gathered once
    torch.testing.assert_close(rope(x.double(), second).float(), b, atol=1e-6, rtol=0)  # another dtype: regathered
