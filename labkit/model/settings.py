"""The kernel settings a `Transformer` carries on every module: lean calls, split products, batch invariance.

A mixin of `labkit.model.transformer.Transformer`: each setting is a model-wide switch that sets an attribute
on the modules that read it (`Linear`, `RMSNorm`, the attention), so `model.batch_invariant = True` reaches
every layer at once.
"""
from __future__ import annotations

from torch import nn

from labkit import checks
from labkit.model.kernels import Linear, RMSNorm

__all__ = ["KernelSettings"]


class KernelSettings:
    """`lean_step`, `split_matvec` and `batch_invariant`, set on every module that has the matching attribute."""

    @property
    def lean_step(self) -> bool:
        """Whether inference takes the lean calls (the default) or the plain ones training takes.

        Plain: `F.linear` for every product, `F.rms_norm`, the embedding module: the same numbers
        in about two thousand more operator calls a SmolLM2 step (chapter 03 measures both).
        """
        return self._lean

    @lean_step.setter
    def lean_step(self, value: bool) -> None:
        self._lean = self._set_on_modules("lean_step", "lean", value, (Linear, RMSNorm))

    @property
    def split_matvec(self) -> bool:
        """Whether products over a few tokens are split over threads by hand (see `linear`); off by default.

        A model setting: `model.split_matvec = True` sets it on every `Linear` of the model.
        """
        return self._split

    @split_matvec.setter
    def split_matvec(self, value: bool) -> None:
        self._split = self._set_on_modules("split_matvec", "split", value, (Linear,))

    @property
    def batch_invariant(self) -> bool:
        """Whether each row of a pass gets the bits it gets alone (off; see `labkit.model.kernels`). Set it after quantizing."""
        return self._invariant

    @batch_invariant.setter
    def batch_invariant(self, value: bool) -> None:
        if value and self.config.compressed_attention:
            raise ValueError("batch_invariant=True is not implemented for compressed attention (csa_block > 0)")
        self._invariant = self._set_on_modules("batch_invariant", "invariant", value, (nn.Module,))

    def _set_on_modules(self, setting: str, attr: str, value: bool, kinds: tuple) -> bool:
        checks.flag(setting, value, error=TypeError)
        for module in self.modules():
            if isinstance(module, kinds) and hasattr(module, attr):
                setattr(module, attr, value)
        return value
