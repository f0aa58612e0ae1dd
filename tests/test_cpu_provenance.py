"""Where a stored figure was measured, and whether it was this machine (`labkit.costmodel.cpu`)."""
from __future__ import annotations

from labkit.costmodel import cpu

XEON = {"cpu": "Intel(R) Xeon(R) Platinum", "flags": {"avx2": True, "avx512": True, "avx512_bf16": True, "vnni": True,
                                                      "amx": True},
        "aten_capability": "AVX512", "emulated_isa": None, "torch": "2.13.0+cpu", "threads": 2}
EPYC = {**XEON, "cpu": "AMD EPYC", "aten_capability": "AVX2",
        "flags": {"avx2": True, "avx512": False, "avx512_bf16": False, "vnni": False, "amx": False}}


def test_describe_names_the_instruction_sets():
    assert cpu.describe(XEON) == ("Intel(R) Xeon(R) Platinum, AVX-512 (+VNNI, +BF16, +AMX), ATen AVX512, "
                                  "torch 2.13.0+cpu, 2 threads")
    assert cpu.describe(EPYC).startswith("AMD EPYC, AVX2 (no VNNI, no BF16, no AMX), ATen AVX2")
    assert "(emulated: avx2)" in cpu.describe({**XEON, "aten_capability": "AVX2", "emulated_isa": "avx2"})


def test_a_figure_from_another_cpu_is_flagged_with_what_differs():
    diff = cpu.differences(XEON, EPYC)
    assert "ATen capability AVX512 there, AVX2 here" in diff and "amx yes there, no here" in diff
    assert "NOT this machine" in cpu.provenance(XEON, EPYC)
    assert cpu.differences(EPYC, EPYC) == [] and "the same kind of machine" in cpu.provenance(EPYC, EPYC)
    assert cpu.differences(EPYC, {**EPYC, "threads": 1}) == ["2 threads there, 1 here"]
    assert "does not say which CPU" in cpu.provenance(None, EPYC)  # an old file without a record is not trusted


def test_this_machine_is_described_from_proc_cpuinfo_and_torch():
    import torch

    info = cpu.cpu_info()
    assert info["aten_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(info["flags"]) == set(cpu.FLAGS) and info["threads"] == torch.get_num_threads()
    assert cpu.differences(info, info) == []


def test_the_emulation_table_matches_the_scripts(root):
    text = (root / "scripts" / "isa_env.sh").read_text()
    for name, env in cpu.ISA_EMULATION.items():
        assert f"{name})" in text and " ".join(f"{k}={v}" for k, v in env.items()) in text
