"""labkit's own block products: GGUF's Q4_1 (or Q4_0) and Q8_0 weights as stored, activations quantized once a pass.

The kernels (`csrc/`, built and loaded by `labkit.quant.native`) are llama.cpp's recipe written out:

  1. each input row is quantized to int8 per block of 32 (Q8_1: a step dx, codes, and sx = dx·Σq),
     once per pass, in C++;
  2. the weight sits in the file's blocks of 32 codes, regrouped so that 16 output rows lie side by
     side: one block of 16 rows is unpacked (Q4: AND, shift) once and used for every input row of
     the pass (up to 16 at a time), so a pass of k rows does not cost k one-row passes of memory;
  3. the integer dot products of 32 codes run in one instruction family (AVX-512 VNNI `vpdpbusd`,
     AVX2 `vpmaddubsw` + `vpmaddwd`, or plain C++), picked from `torch.backends.cpu.get_cpu_capability()`,
     so `ATEN_CPU_CAPABILITY=avx2` (or `default`) runs the smaller path;
  4. per block: acc += isum·(dw·dx), then (Q4_1) acc += mw·sx, in float32, in block order; threads
     split the output rows.

Exact by construction: the integer sums are exact and the float operations run in one fixed order
per output, so a row's result depends neither on the other rows of the pass (batch invariance
without a special mode) nor on the path; `reference` and `reference_q8` (plain torch, the same
arithmetic) equal the kernels bit for bit, which is how the tests check every path.

    >>> from labkit.quant import native
    >>> layer = Q4Q8Linear(torch.randint(0, 16, (32, 64), dtype=torch.uint8), torch.full((32, 2), 2.0 ** -7))
    >>> layer(torch.randn(3, 64)).shape if native.available() else torch.Size([3, 32])
    torch.Size([3, 32])
"""
from __future__ import annotations

import torch
from torch import nn

from labkit import checks
from labkit.quant import intdot
from labkit.quant.native import PATHS, ROWS, build, path_for

__all__ = ["pack", "pack_q8", "unpack", "mm", "reference", "reference_q8", "Q4Q8Linear", "Q8Q8Linear", "BLOCK"]

BLOCK = 32


def pack(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None) -> dict:
    """The kernel's layout of a Q4_1 matrix: codes [N, K] in 0..15, steps d and minimums m [N, K/32].

    m=None is Q4_0 (w = d·(q − 8)), handed over as m = −8·d (exact in float16). Rows are padded to a
    multiple of 16 with zero blocks. Returns {"codes" uint8 [G, K/32, 4, 16, 4], "dw", "mw" float16
    [G, K/32, 16], "out_features"}.
    """
    checks.tensor("codes", codes, ndim=2)
    n, k = codes.shape
    if k % BLOCK:
        raise ValueError(f"codes must have a multiple of {BLOCK} columns, got {k}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError(f"codes must lie in 0..15, got {int(codes.min())}..{int(codes.max())}")
    nb = k // BLOCK
    if tuple(d.shape) != (n, nb) or (m is not None and tuple(m.shape) != (n, nb)):
        raise ValueError(f"d and m must be [{n}, {nb}] (one per block of {BLOCK}), got {tuple(d.shape)}"
                         f"{'' if m is None else ' and ' + str(tuple(m.shape))}")
    dw, mw = d.half(), (-8 * d).half() if m is None else m.half()
    if not (torch.equal(dw.float(), d.float()) and (m is None or torch.equal(mw.float(), m.float()))):
        raise ValueError("d and m must be float16 values (as the file stores them); rounding them would change the weights")
    pad = -n % ROWS
    c = torch.nn.functional.pad(codes.to(torch.uint8), (0, 0, 0, pad)).reshape(n + pad, nb, 2, 16)
    byte = c[:, :, 0] | (c[:, :, 1] << 4)  # [Np, nb, 16]: byte j = code j | code j + 16 << 4, as the file
    g = (n + pad) // ROWS
    packed = byte.reshape(g, ROWS, nb, 4, 4).permute(0, 2, 3, 1, 4).contiguous()  # [G, nb, chunk, row, 4]
    grouped = lambda t: torch.nn.functional.pad(t, (0, 0, 0, pad)).reshape(g, ROWS, nb).transpose(1, 2).contiguous()  # noqa: E731
    return {"codes": packed, "dw": grouped(dw), "mw": grouped(mw), "out_features": n}


def unpack(packed: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`pack` undone: (codes uint8 [N, K], d, m float32 [N, K/32]) of the packed matrix."""
    c = packed["codes"]
    g, nb = c.shape[:2]
    byte = c.permute(0, 3, 1, 2, 4).reshape(g * ROWS, nb, 16)
    codes = torch.stack([byte & 15, byte >> 4], dim=2).reshape(g * ROWS, nb * BLOCK)
    rows = lambda t: t.transpose(1, 2).reshape(g * ROWS, nb).float()  # noqa: E731
    n = packed["out_features"]
    return codes[:n], rows(packed["dw"])[:n], rows(packed["mw"])[:n]


def pack_q8(codes: torch.Tensor, d: torch.Tensor) -> dict:
    """The kernel's layout of a Q8_0 matrix: int8 codes [N, K], float16 steps d [N, K/32] (rows padded to 16).

    Returns {"codes" int8 [G, K/32, 8, 16, 4], "dw" float16 [G, K/32, 16], "out_features"}.
    """
    checks.tensor("codes", codes, ndim=2, dtype=torch.int8)
    n, k = codes.shape
    if k % BLOCK or tuple(d.shape) != (n, k // BLOCK):
        raise ValueError(f"codes [N, K] need K a multiple of {BLOCK} and d [N, K/{BLOCK}], got {tuple(codes.shape)} "
                         f"and {tuple(d.shape)}")
    dw = d.half()
    if not torch.equal(dw.float(), d.float()):
        raise ValueError("d must hold float16 values (as the file stores them); rounding them would change the weights")
    nb, pad = k // BLOCK, -n % ROWS
    g = (n + pad) // ROWS
    c = torch.nn.functional.pad(codes, (0, 0, 0, pad)).reshape(g, ROWS, nb, 8, 4).permute(0, 2, 3, 1, 4).contiguous()
    steps = torch.nn.functional.pad(dw, (0, 0, 0, pad)).reshape(g, ROWS, nb).transpose(1, 2).contiguous()
    return {"codes": c, "dw": steps, "out_features": n}


def mm(x: torch.Tensor, packed: dict, path: str | None = None) -> torch.Tensor:
    """x [M, K] float32 times a packed weight (`pack`: Q4_1, `pack_q8`: Q8_0): [M, N] float32, on `path`
    (this process's by default, `labkit.quant.native.path_for`)."""
    build()
    path = path_for() if path is None else checks.one_of("path", path, PATHS)
    if "mw" in packed:
        y = torch.ops.labkit.q4q8_mm(x, packed["codes"], packed["dw"], packed["mw"], PATHS.index(path))
    else:
        y = torch.ops.labkit.q8q8_mm(x, packed["codes"], packed["dw"], PATHS.index(path))
    n = packed["out_features"]
    return y if y.shape[1] == n else y[:, :n]


def reference(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's arithmetic in plain torch (the tests' oracle): x [M, K], codes [N, K] 0..15, d, m [N, K/32].

    Q8_1 activations (`labkit.quant.intdot.quantize_activations`), exact int32 block sums, then per
    block, in block order: acc = acc + isum·(dw·dx); acc = acc + mw·sx.
    """
    qa, dx, sx = intdot.quantize_activations(x.float(), with_sum=True)
    sums = intdot.block_sums(qa, codes.to(torch.int8)).float()  # [M, N, nb], exact
    dw = d.half().float()
    mw = (-8 * d).half().float() if m is None else m.half().float()
    acc = torch.zeros(x.shape[0], codes.shape[0])
    for b in range(sums.shape[2]):
        acc = acc + sums[:, :, b] * (dw[None, :, b] * dx[:, None, b])
        acc = acc + mw[None, :, b] * sx[:, None, b]
    return acc


def reference_q8(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The Q8_0 kernel's arithmetic in plain torch: per block, in block order, acc = acc + isum·(dw·dx)."""
    qa, dx, _ = intdot.quantize_activations(x.float())
    sums = intdot.block_sums(qa, codes).float()
    dw = d.half().float()
    acc = torch.zeros(x.shape[0], codes.shape[0])
    for b in range(sums.shape[2]):
        acc = acc + sums[:, :, b] * (dw[None, :, b] * dx[:, None, b])
    return acc




class _BlockLayer(nn.Module):
    """What both kernel layers share: packed buffers, float32 rows in, the input's dtype out."""

    def _setup(self, packed: dict, op: str) -> None:
        build()  # KernelUnavailable, with its reason, where the kernels cannot be built
        self.out_features = packed["out_features"]
        for name in ("codes", "dw", "mw"):
            if name in packed:
                self.register_buffer(name, packed[name])
        self.invariant = False  # the model's batch-invariant switch sets it; every pass is row-invariant already
        self._op, self._path = getattr(torch.ops.labkit, op).default, PATHS.index(path_for())

    def _packed(self) -> dict:
        parts = {"codes": self.codes, "dw": self.dw, "out_features": self.out_features}
        return {**parts, "mw": self.mw} if hasattr(self, "mw") else parts

    def _finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if y.shape[1] != self.out_features:
            y = y[:, :self.out_features]
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt} × Q8, path {PATHS[self._path]}"


class Q4Q8Linear(_BlockLayer):
    """y = x Wᵀ with W in GGUF's Q4_1 (or Q4_0, m=None) blocks of 32, on labkit's int4 × int8 kernel.

    Input rows of any float dtype are read as float32 and quantized to Q8_1 inside the kernel; the
    output is float32 (cast back to the input's dtype). Every row gets the bits it gets alone.
    """

    fmt = "Q4_1"

    def __init__(self, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None):
        super().__init__()
        self.in_features = codes.shape[1]
        self._setup(pack(codes, d, m), "q4q8_mm")

    @classmethod
    def from_quantized(cls, qt) -> "Q4Q8Linear":
        """From a `labkit.quant.rtn.QuantizedTensor` of 4-bit asymmetric codes in groups of 32 (Q4_1's layout)."""
        if qt.bits != 4 or qt.group_size != BLOCK or qt.symmetric or qt.per_tensor:
            raise ValueError(f"the int4 × int8 kernel takes 4-bit asymmetric codes in groups of {BLOCK}, got "
                             f"bits={qt.bits}, group_size={qt.group_size}, symmetric={qt.symmetric}")
        return cls(qt.codes, qt.scale, qt.minimum)

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes uint8 [N, K] in 0..15, d, m float32 [N, K/32]): the layer's Q4_1 blocks as the file stores them."""
        return unpack(self._packed())

    @property
    def weight(self) -> torch.Tensor:
        """The float32 matrix the blocks stand for (for inspection; the forward never builds it)."""
        codes, d, m = self.blocks()
        return codes.float() * d.repeat_interleave(BLOCK, 1) + m.repeat_interleave(BLOCK, 1)

    def nbytes(self) -> int:
        """Bytes of the format, as the file stores it: 4 bits per code, a float16 step and minimum per block."""
        return self.out_features * self.in_features // 2 + 4 * self.out_features * (self.in_features // BLOCK)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        x2 = x2 if x2.dtype == torch.float32 else x2.float()
        return self._finish(self._op(x2, self.codes, self.dw, self.mw, self._path), x)


class Q8Q8Linear(_BlockLayer):
    """y = x Wᵀ with W in GGUF's Q8_0 blocks of 32 (int8 codes, a float16 step), on labkit's int8 × int8 kernel."""

    fmt = "Q8_0"

    def __init__(self, codes: torch.Tensor, d: torch.Tensor):
        super().__init__()
        self.in_features = codes.shape[1]
        self._setup(pack_q8(codes, d), "q8q8_mm")

    @property
    def weight(self) -> torch.Tensor:
        """The float32 matrix the blocks stand for."""
        g, nb = self.codes.shape[:2]
        codes = self.codes.permute(0, 3, 1, 2, 4).reshape(g * ROWS, nb * BLOCK)[:self.out_features]
        d = self.dw.transpose(1, 2).reshape(g * ROWS, nb)[:self.out_features].float()
        return codes.float() * d.repeat_interleave(BLOCK, 1)

    def nbytes(self) -> int:
        """Bytes of the format: one byte per code and a float16 step per block of 32."""
        return self.out_features * self.in_features + 2 * self.out_features * (self.in_features // BLOCK)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        x2 = x2 if x2.dtype == torch.float32 else x2.float()
        return self._finish(self._op(x2, self.codes, self.dw, self._path), x)
