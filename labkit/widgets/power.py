"""Widgets of chapter 08: sliders wired to the figures of `labkit.viz.power`, redrawn in place.

Each function returns a VBox; `box.redraw()` redraws it and `box.controls` names its controls
(the benchmark in `labkit.benchmarks.costmodel` times the callbacks through them).
"""
from __future__ import annotations

__all__ = ["power_timeline", "energy_vs_reply", "kv_placement", "dvfs_explorer", "swap_explorer"]

LENGTHS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096]


def _options(values, value) -> list:
    """Slider stops, with `value` added if it is not one of them (so any starting value works)."""
    return sorted(set(values) | {value})


def hardware_names(include_this_machine: bool = False) -> list[str]:
    from labkit.costmodel.profiles import HARDWARE

    return [k for k in HARDWARE if include_this_machine or k != "this-machine"]


def model_names() -> list[str]:
    from labkit.model.config import PRESETS

    return [n for n, shape in PRESETS.items() if not shape.get("csa_block")]  # the power model's layers are dense


def _npu_bits(hw_key: str) -> dict:
    """Phones and NPUs run INT8 activations; everything else fp16 activations."""
    from labkit.costmodel.profiles import hardware

    hw = hardware(hw_key)
    return {"act_bits": 8} if hw.kind == "phone" or "npu" in hw.name.lower() else {"act_bits": 16}


def _box(controls: dict, figs: list, redraw, message=None):
    import ipywidgets as widgets

    rows, row = [], []
    for c in controls.values():
        row.append(c)
        if len(row) == 3:
            rows.append(widgets.HBox(row))
            row = []
    if row:
        rows.append(widgets.HBox(row))
    for c in controls.values():
        c.observe(lambda _change: redraw(), names="value")
    extra = [message] if message is not None else []
    box = widgets.VBox(rows + list(figs) + extra)
    box.redraw, box.controls, box.figures = redraw, controls, figs
    return box


def _guard(message, fn):
    """Run fn(); show a ValueError (e.g. a mechanism the chip lacks) in `message` instead of raising."""
    try:
        fn()
        message.value = ""
    except ValueError as err:
        message.value = f"<b>not possible:</b> {err}"


def power_timeline(config: str = "llama-3.2-3b", hw: str = "phone-sd8gen3", prompt_len: int = 64, reply_len: int = 24):
    """Power vs time of one reply: split vs monolithic; switch mechanism, clocks, pre-wake and weight bits."""
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit import power
    from labkit.costmodel.profiles import hardware
    from labkit.viz import _spec
    from labkit.viz.power import power_timeline_figure, power_timeline_spec

    c = {
        "hw": widgets.Dropdown(options=hardware_names(), value=hw, description="hardware"),
        "model": widgets.Dropdown(options=model_names(), value=config, description="model"),
        "switch": widgets.Dropdown(options=list(power.SWITCHES), value="dvfs", description="switch"),
        "prompt": widgets.SelectionSlider(options=_options(LENGTHS[3:], prompt_len), value=prompt_len, description="prompt"),
        "reply": widgets.SelectionSlider(options=_options(LENGTHS, reply_len), value=reply_len, description="reply"),
        "bits": widgets.Dropdown(options=[4, 8, 16], value=4, description="weight bits"),
        "core": widgets.FloatSlider(min=0, max=100, step=5, value=0, description="decode core %",
                                    tooltip="decode core clock, % of the top; 0 = auto (lowest free level)"),
        "mem": widgets.FloatSlider(min=25, max=100, step=5, value=100, description="decode mem %"),
        "overlap": widgets.Checkbox(value=False, description="pre-wake (overlap the switch)"),
    }
    message = widgets.HTML()

    def timelines():
        h = hardware(c["hw"].value)
        core = "auto" if c["core"].value == 0 else max(h.vf.fmax * c["core"].value / 100, 1.0)
        kw = dict(weight_bits=c["bits"].value, **_npu_bits(h.key))
        split = power.simulate(c["model"].value, h, c["prompt"].value, c["reply"].value, switch=c["switch"].value,
                               decode_mhz=core, decode_mem_mhz=h.fmax_mem * c["mem"].value / 100,
                               overlap_switch=c["overlap"].value, **kw)
        mono = power.simulate(c["model"].value, h, c["prompt"].value, c["reply"].value, mode="monolithic", **kw)
        return split, mono

    fig = go.FigureWidget(power_timeline_figure(*timelines()))

    def redraw():
        def draw():
            split, mono = timelines()
            _spec.apply(fig, power_timeline_spec(split, mono))
            parts = ", ".join(f"{k} {v * 1e3:.0f} mJ" for k, v in split.by_phase.items())
            message.value = (f"split by phase: {parts}; decode at {split.levels['decode_mhz']:.0f} MHz; "
                             f"worst gap between tokens {split.itl_s.max() * 1e3 if len(split.itl_s) else 0:.1f} ms")
        _guard(message, draw)

    redraw()
    return _box(c, [fig], redraw, message)


def energy_vs_reply(config: str = "llama-3.2-3b", hw: str = "phone-sd8gen3", prompt_len: int = 64):
    """Energy vs reply length for both policies, with the break-even n*, per switch mechanism."""
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit import power
    from labkit.costmodel.profiles import hardware
    from labkit.viz import _spec
    from labkit.viz.power import energy_vs_reply_figure, energy_vs_reply_spec

    c = {
        "hw": widgets.Dropdown(options=hardware_names(), value=hw, description="hardware"),
        "switch": widgets.Dropdown(options=list(power.SWITCHES), value="handoff", description="switch"),
        "prompt": widgets.SelectionSlider(options=_options(LENGTHS[3:], prompt_len), value=prompt_len, description="prompt"),
        "graph": widgets.FloatLogSlider(min=0, max=3, value=360, description="graph load ms"),
    }
    message = widgets.HTML()

    def result():
        h = hardware(c["hw"].value).replace(graph_load_ms=c["graph"].value)
        return power.energy_vs_reply_len(config, h, c["prompt"].value, 1024, switch=c["switch"].value,
                                         weight_bits=4, **_npu_bits(h.key))

    fig = go.FigureWidget(energy_vs_reply_figure(result()))

    def redraw():
        _guard(message, lambda: _spec.apply(fig, energy_vs_reply_spec(result())))

    return _box(c, [fig], redraw, message)


def kv_placement(config: str = "llama-3.2-3b", hw: str = "phone-sd8gen3"):
    """Energy per decode token vs context with a slider for the SRAM given to the KV cache."""
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit.costmodel.profiles import hardware
    from labkit.viz import _spec
    from labkit.viz.power import kv_placement_figure, kv_placement_spec

    onchip = hardware(hw).onchip_mb
    c = {
        "model": widgets.Dropdown(options=model_names(), value=config, description="model"),
        "sram": widgets.FloatSlider(min=0, max=onchip, step=onchip / 16, value=onchip, description="SRAM MB"),
        "kv_bits": widgets.Dropdown(options=[16, 8, 4], value=16, description="KV bits"),
        "batch": widgets.SelectionSlider(options=[1, 2, 4, 8, 16], value=1, description="batch"),
    }

    def spec():
        return kv_placement_spec(c["model"].value, hw, c["sram"].value, batch=c["batch"].value, weight_bits=4,
                                 kv_bits=c["kv_bits"].value, **_npu_bits(hw))

    fig = go.FigureWidget(kv_placement_figure(config, hw, onchip, weight_bits=4, **_npu_bits(hw)))

    def redraw():
        _spec.apply(fig, spec())

    return _box(c, [fig], redraw)


def dvfs_explorer(config: str = "llama-3.2-3b", hw: str = "phone-sd8gen3"):
    """Prefill and decode time and energy vs the core clock and the memory clock."""
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit.costmodel.profiles import hardware
    from labkit.viz import _spec
    from labkit.viz.power import dvfs_figure, dvfs_spec

    c = {
        "hw": widgets.Dropdown(options=hardware_names(), value=hw, description="hardware"),
        "prompt": widgets.SelectionSlider(options=LENGTHS[3:], value=128, description="prompt"),
        "context": widgets.SelectionSlider(options=LENGTHS[3:], value=256, description="decode context"),
        "bits": widgets.Dropdown(options=[4, 8, 16], value=4, description="weight bits"),
    }

    def spec():
        h = c["hw"].value
        return dvfs_spec(config, h, c["prompt"].value, c["context"].value, weight_bits=c["bits"].value, **_npu_bits(h))

    fig = go.FigureWidget(dvfs_figure(config, hw, 128, 256, weight_bits=4, **_npu_bits(hw)))

    def redraw():
        _spec.apply(fig, spec())

    return _box(c, [fig], redraw)


def swap_explorer(config: str = "llama-2-7b", hw: str = "phone-sd8gen3"):
    """Swap vs recompute of evicted KV, with a slider for the offload link's bandwidth."""
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit.costmodel.profiles import hardware
    from labkit.viz import _spec
    from labkit.viz.power import swap_recompute_figure, swap_recompute_spec

    base = hardware(hw)
    c = {"bw": widgets.FloatLogSlider(min=-2, max=2, value=base.offload_bw_gbs, description="offload GB/s"),
         "model": widgets.Dropdown(options=model_names(), value=config, description="model")}

    def spec():
        h = base.replace(offload_bw_gbs=c["bw"].value)
        return swap_recompute_spec(c["model"].value, h, weight_bits=4, **_npu_bits(hw))

    fig = go.FigureWidget(swap_recompute_figure(config, base, weight_bits=4, **_npu_bits(hw)))

    def redraw():
        _spec.apply(fig, spec())

    return _box(c, [fig], redraw)
