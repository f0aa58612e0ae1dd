"""Hardware profiles: peak FLOP/s, memory levels, energy per bit and per op, clocks and power.

Profiles live in `data/hardware.yaml`; every field there carries a confidence mark and
a source, kept here in `Hardware.provenance`. "this-machine" is measured with
`labkit.costmodel.measure` the first time it is asked for, then cached for the session.

    >>> hw = hardware("h100-sxm")
    >>> hw.peak_flops("fp16") / 1e12, hw.mem_bw_gbs
    (989.0, 3350.0)
    >>> hw.provenance["mem_bw_gbs"][0]
    'datasheet'
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from labkit import checks
from labkit.costmodel.dvfs import PowerState, VFTable

__all__ = ["Hardware", "HARDWARE", "hardware", "this_machine", "profile_table", "PRECISIONS", "precision_for"]

PRECISIONS = ("int4", "int8", "fp16", "fp32")  # narrow -> wide
LEVELS = ("onchip", "dram", "offload")
CONFIDENCE = ("measured", "datasheet", "repository", "paper", "derived", "secondary", "assumed")
THIS_MACHINE = "this-machine"


def precision_for(weight_bits: float, act_bits: float = 16) -> str:
    """The arithmetic a layer runs in: the wider of weights and activations.

    Weight-only quantization (W4A16) still multiplies in fp16: >>> precision_for(4, 16) -> 'fp16'.
    """
    bits = max(weight_bits, act_bits)
    return "int4" if bits <= 4 else "int8" if bits <= 8 else "fp16" if bits <= 16 else "fp32"


def _lookup(table: dict, precision: str, what: str):
    """Value for `precision`, else the nearest wider precision listed, else the widest listed."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    for p in PRECISIONS[PRECISIONS.index(precision):]:
        if table.get(p):
            return table[p]
    for p in reversed(PRECISIONS):
        if table.get(p):
            return table[p]
    raise ValueError(f"{what} lists no precision at all")


@dataclass(frozen=True)
class Hardware:
    """One device. Bandwidths in GB/s, capacities in GB (DRAM) and MiB (on chip), energies in pJ, power in W."""

    key: str
    name: str
    kind: str
    peak_tflops: dict
    mem_bw_gbs: float
    mem_gb: float
    onchip_mb: float
    onchip_bw_gbs: float
    offload_name: str
    offload_bw_gbs: float
    e_bit_pj: dict
    e_op_pj: dict
    compute_eff: float
    mem_eff: float
    link_bw_gbs: float
    link_latency_us: float
    p_idle_w: float
    p_base_w: float
    p_static_w: float
    p_clock_w: float
    p_mem_bg_w: float
    tdp_w: float
    core_vf: tuple
    mem_mhz: tuple
    power_states: dict = field(default_factory=dict)
    dvfs_latency_us: float = 40.0
    graph_load_ms: float = 0.0
    hysteresis_ms: float = 0.0
    compute_eff_rows: tuple = ()   # ((rows, eff), ...): linear layers' efficiency by tokens per product (measured)
    provenance: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        positive = ("mem_bw_gbs", "mem_gb", "offload_bw_gbs", "onchip_bw_gbs", "tdp_w")
        unit = ("compute_eff", "mem_eff")
        nonneg = ("onchip_mb", "link_bw_gbs", "link_latency_us", "p_idle_w", "p_base_w", "p_static_w",
                  "p_clock_w", "p_mem_bg_w", "dvfs_latency_us", "graph_load_ms", "hysteresis_ms")
        for name in positive + unit + nonneg:
            value, where = getattr(self, name), f"{self.key}: {name}"
            if name in positive:
                checks.positive(where, value)
            elif name in unit:
                checks.number(where, value, 0, 1, low_open=True)
            else:
                checks.number(where, value, 0)
            object.__setattr__(self, name, float(value))
        if not any(self.peak_tflops.get(p) for p in PRECISIONS):
            raise ValueError(f"{self.key}: peak_tflops must give a positive rate for at least one of {PRECISIONS}, got {self.peak_tflops!r}")
        for p, v in self.peak_tflops.items():
            if p not in PRECISIONS or not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{self.key}: peak_tflops[{p!r}] must be a positive number for a precision in {PRECISIONS}, got {v!r}")
        for lvl in LEVELS:
            v = self.e_bit_pj.get(lvl)
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"{self.key}: e_bit_pj[{lvl!r}] must be a number >= 0, got {v!r}")
        if not self.mem_mhz or any(not (isinstance(m, (int, float)) and m > 0) for m in self.mem_mhz):
            raise ValueError(f"{self.key}: mem_mhz must list positive frequencies, got {self.mem_mhz!r}")
        if list(self.mem_mhz) != sorted(set(self.mem_mhz)):
            raise ValueError(f"{self.key}: mem_mhz must be strictly increasing, got {list(self.mem_mhz)}")
        object.__setattr__(self, "vf", VFTable(self.core_vf))  # validates the table
        object.__setattr__(self, "compute_eff_rows", _check_eff_rows(self.key, self.compute_eff_rows))

    # --- derived quantities -------------------------------------------------------------
    def peak_flops(self, precision: str = "fp16") -> float:
        """Peak operations per second (dense) in `precision`, falling back to a wider one."""
        return _lookup(self.peak_tflops, precision, f"{self.key}.peak_tflops") * 1e12

    def e_op(self, precision: str = "fp16") -> float:
        """Joules per delivered operation at the top voltage."""
        return _lookup(self.e_op_pj, precision, f"{self.key}.e_op_pj") * 1e-12

    def e_bit(self, level: str) -> float:
        """Joules per bit moved at a memory level: 'onchip', 'dram' or 'offload'."""
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        return self.e_bit_pj[level] * 1e-12

    def compute_eff_at(self, rows):
        """The linear layers' compute efficiency for products over `rows` tokens (array allowed).

        Without a measured table this is `compute_eff`. With one (`compute_eff_rows`, from
        `labkit.benchmarks.calibrate`) it is interpolated in log(rows), and held at the ends.
        """
        if not self.compute_eff_rows:
            return self.compute_eff
        r, e = np.array(self.compute_eff_rows, dtype=float).T
        return np.interp(np.log(np.maximum(np.asarray(rows, dtype=float), 1.0)), np.log(r), e)

    @property
    def fmax_mem(self) -> float:
        return float(self.mem_mhz[-1])

    def ridge_intensity(self, precision: str = "fp16", compute_eff: float | None = None, mem_eff: float | None = None) -> float:
        """FLOP per byte at which compute time equals memory time (the roofline's ridge)."""
        ce = self.compute_eff if compute_eff is None else compute_eff
        me = self.mem_eff if mem_eff is None else mem_eff
        return self.peak_flops(precision) * ce / (self.mem_bw_gbs * 1e9 * me)

    def replace(self, **changes) -> "Hardware":
        """A copy with some fields changed (validated again): `hw.replace(mem_bw_gbs=100)`."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line per field: value, confidence, source."""
        lines = [f"{self.name} [{self.key}]"]
        for name, (conf, src) in self.provenance.items():
            value = getattr(self, name, None)
            lines.append(f"  {name:16s} {value!s:40.40s} {conf:10s} {src}")
        return "\n".join(lines)


def _check_eff_rows(key: str, table) -> tuple:
    pairs = tuple(tuple(p) for p in table)
    ok = all(len(p) == 2 and all(checks.is_number(v) for v in p)
             and p[0] >= 1 and 0 < p[1] <= 1 for p in pairs)
    if not ok or [p[0] for p in pairs] != sorted({p[0] for p in pairs}):
        raise ValueError(f"{key}: compute_eff_rows must be (rows >= 1, efficiency in (0, 1]) pairs with rows "
                         f"strictly increasing, got {table!r}")
    return tuple((float(r), float(e)) for r, e in pairs)


# --- loading ----------------------------------------------------------------------------
def _from_yaml_entry(key: str, entry: dict) -> Hardware:
    values, provenance = {}, {}
    for name, cell in entry.items():
        if not (isinstance(cell, dict) and "value" in cell):
            raise ValueError(f"hardware.yaml: {key}.{name} must be {{value, conf, src}}, got {cell!r}")
        conf = cell.get("conf", "assumed")
        if conf not in CONFIDENCE:
            raise ValueError(f"hardware.yaml: {key}.{name} conf must be one of {CONFIDENCE}, got {conf!r}")
        values[name] = cell["value"]
        provenance[name] = (conf, str(cell.get("src", "")))
    values["core_vf"] = tuple(tuple(p) for p in values["core_vf"])
    values["mem_mhz"] = tuple(values["mem_mhz"])
    values["power_states"] = {n: PowerState(name=n, **s) for n, s in (values.get("power_states") or {}).items()}
    if "compute_eff_rows" not in values:
        provenance["compute_eff_rows"] = ("assumed", "not measured: compute_eff holds at every product size")
    return Hardware(key=key, provenance=provenance, **values)


def _load_yaml() -> dict:
    import yaml

    from labkit.data.paths import data_path

    with open(data_path("hardware.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)["profiles"]


_MEASURED: dict[str, Hardware] = {}


def this_machine(seconds: float = 0.3, refresh: bool = False) -> Hardware:
    """This machine's profile: read bandwidth and float32 matmul FLOP/s measured now (~4 x `seconds`).

    The measured copy bandwidth is kept as `.copy_bw_gbs` (the name lists all three numbers). The result
    is cached for the session; `refresh=True` measures again.
    """
    if THIS_MACHINE in _MEASURED and not refresh:
        return _MEASURED[THIS_MACHINE]
    from labkit.costmodel import measure as hwmeasure

    entry = {k: dict(v) for k, v in _load_yaml()[THIS_MACHINE].items()}
    read_gb_s = hwmeasure.read_bandwidth_gb_s(seconds=seconds)
    copy_gb_s = hwmeasure.copy_bandwidth_gb_s(seconds=seconds)
    flops = hwmeasure.matmul_flops(seconds=seconds)
    entry["mem_bw_gbs"]["value"] = round(read_gb_s, 3)
    entry["peak_tflops"]["value"] = {"fp32": flops / 1e12}
    entry["name"]["value"] = f"this machine (measured: {read_gb_s:.1f} GB/s read, {copy_gb_s:.1f} GB/s copy, {flops / 1e9:.0f} GFLOP/s fp32)"
    hw = _from_yaml_entry(THIS_MACHINE, entry)
    object.__setattr__(hw, "copy_bw_gbs", copy_gb_s)
    _MEASURED[THIS_MACHINE] = hw
    return hw


class _Profiles(Mapping):
    """name -> Hardware; 'this-machine' is measured on first access, the rest read from YAML once."""

    def __init__(self):
        self._raw = None
        self._built: dict[str, Hardware] = {}

    def _entries(self) -> dict:
        if self._raw is None:
            self._raw = _load_yaml()
        return self._raw

    def __getitem__(self, key: str) -> Hardware:
        if key == THIS_MACHINE:
            return this_machine()
        if key not in self._built:
            self._built[key] = _from_yaml_entry(key, self._entries()[key])
        return self._built[key]

    def __iter__(self):
        return iter(self._entries())

    def __len__(self) -> int:
        return len(self._entries())

    def __repr__(self) -> str:
        return f"HARDWARE({list(self)})"


HARDWARE = _Profiles()


def hardware(name) -> Hardware:
    """A profile by name (case-insensitive); a `Hardware` passes through unchanged.

    Unknown names raise a ValueError that lists the known ones.
    """
    if isinstance(name, Hardware):
        return name
    if not isinstance(name, str):
        raise TypeError(f"hardware name must be a string or a Hardware, got {type(name).__name__}")
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
    return HARDWARE[key]


_MARK = {"measured": "M", "datasheet": "D", "repository": "R", "paper": "P", "derived": "d", "secondary": "S", "assumed": "A"}


def profile_table(keys=None) -> str:
    """A text table of the main numbers of each profile, each followed by its confidence mark.

    Marks: D datasheet, R repository, P paper, d derived, S secondary, A assumed, M measured.
    """
    keys = [k for k in HARDWARE if k != THIS_MACHINE] if keys is None else list(keys)
    head = f"{'profile':24s} {'fp16 TFLOP/s':>14s} {'int8 TOP/s':>12s} {'DRAM GB/s':>11s} {'DRAM GB':>9s} {'SRAM MB':>9s} {'TDP W':>8s}"
    rows = [head]
    for key in keys:
        hw = hardware(key)

        def cell(name, value, width):
            return f"{value:>{width - 2},.4g} {_MARK[hw.provenance[name][0]]}"

        rows.append(f"{key:24s} {cell('peak_tflops', hw.peak_flops('fp16') / 1e12, 14)} "
                    f"{cell('peak_tflops', hw.peak_flops('int8') / 1e12, 12)} {cell('mem_bw_gbs', hw.mem_bw_gbs, 11)} "
                    f"{cell('mem_gb', hw.mem_gb, 9)} {cell('onchip_mb', hw.onchip_mb, 9)} {cell('tdp_w', hw.tdp_w, 8)}")
    return "\n".join(rows + ["marks: D datasheet, R repository file, P paper/vendor page, d derived, S secondary, A assumed, M measured"])
