"""Load a Llama- or Gemma-3-architecture GGUF file into `labkit.model.Transformer`.

The file format is llama.cpp's GGUF (`ggml/docs/gguf.md`): a header of key-value
metadata (hyper-parameters, the tokenizer) followed by tensors in GGML block formats.
`gguf.GGUFReader` parses the container; the weights are decoded by labkit's own
`labkit.quant.ggml`, and the names map as follows:

    token_embd             -> tok_embeddings          (also the LM head when `output` is absent)
    blk.N.attn_norm        -> layers.N.attn_norm
    blk.N.attn_q / _k / _v -> layers.N.attn.wqkv      (fused: rows [q; k; v])
    blk.N.attn_output      -> layers.N.attn.wo
    blk.N.ffn_norm         -> layers.N.ffn_norm
    blk.N.ffn_gate / _up   -> layers.N.mlp.w_gate_up  (fused: rows [gate; up])
    blk.N.ffn_down         -> layers.N.mlp.w_down
    output_norm / output   -> norm / lm_head
    Gemma 3 adds: blk.N.attn_q_norm / attn_k_norm -> layers.N.attn.q_norm / k_norm (per head),
                  blk.N.post_attention_norm / post_ffw_norm -> layers.N.post_attn_norm / post_ffn_norm

Gemma 3 is the same `Transformer` with another config (`gemma3_fields`): sandwich norms, QK-norm,
GeGLU, embeddings × √d_model, five sliding layers (RoPE base 10,000) to every global one (the file's
base). The sliding pattern and the local base are not in the file; llama.cpp sets them for the
architecture, and so does this loader. The file's norm weights already hold Gemma's "1 +": they are
used as they are. llama.cpp scales the embeddings by √d_model in float32 (Hugging Face's reference
rounds the factor to bfloat16 first); the loader follows llama.cpp, whose outputs the tests compare with.

llama.cpp's converter stores Llama Q/K rows in the interleaved RoPE layout (see
`labkit.model.rope`), so the model is built with `rope_layout="interleaved"`; asking for
"half" permutes the Q/K rows to match, unless `permute_qk=False` (the classic bug,
kept as a negative control: the model runs and says nonsense).

    >>> model = load_gguf(labkit.data.paths.smollm2_gguf_path())      # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from labkit.quant import ggml as ggml_quants
from labkit.model.config import ModelConfig
from labkit.model.transformer import Transformer
from labkit.model.rope import permute_qk_rows

SUPPORTED_ARCHITECTURES = ("llama", "gemma3")
# how each architecture's converter lays out the Q/K rows
NATIVE_ROPE_LAYOUT = {"llama": "interleaved", "gemma3": "half"}
GEMMA3_GLOBAL_EVERY = 6  # layers 5, 11, 17, ... attend globally, the rest through the sliding window
GEMMA3_LOCAL_ROPE_BASE = 10_000.0


_readers: dict[tuple, object] = {}  # (path, size, mtime) -> GGUFReader: parsing the header takes seconds


def open_gguf(path):
    """Open a GGUF file with `gguf.GGUFReader`, turning its terse errors into ones that name the file.

    Readers are kept per file (path, size, modification time), since the tensors are
    memory-mapped and the header parse is the slow part.
    """
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _readers:
        _readers[key] = _read(gguf, path)
    return _readers[key]


def _read(gguf, path: Path):
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, a GGUF file starts with b'GGUF'")
    try:
        return _reader_class(gguf)(path)
    except Exception as exc:  # numpy reshape / view errors when the file ends early
        raise ValueError(f"{path} could not be read as GGUF ({path.stat().st_size} bytes): the file is truncated "
                         f"or corrupt ({type(exc).__name__}: {exc})") from exc


_classes: list = []


def _reader_class(gguf):
    """`gguf.GGUFReader` reading arrays of numbers and of strings in bulk. The package reads an array element by
    element, a numpy view each: a 262,144-token vocabulary (its pieces, scores and types) took seconds. The fields
    it builds give the same `contents()` (`tests/test_gguf_loader.py` compares every field of a file)."""
    if _classes:
        return _classes[0]
    import struct

    import numpy as np

    array, string = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING

    class Reader(gguf.GGUFReader):
        def _get_field_parts(self, orig_offs, raw_type):
            if gguf.GGUFValueType(raw_type) != array or self.byte_order != "I":
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
            itype, n, offs = gguf.GGUFValueType(raw_itype[0]), int(alen[0]), orig_offs + 12
            nptype = self.gguf_scalar_to_np.get(itype)
            if n == 0 or (nptype is None and itype != string):
                return super()._get_field_parts(orig_offs, raw_type)  # empty, or an array of arrays
            if nptype is not None:  # one part holds the whole array: contents() flattens the parts it points to
                values = self._get(offs, nptype, n)
                return offs + int(values.nbytes) - orig_offs, [raw_itype, alen, values], [2], [array, itype]
            plain, parts = self.data.view(np.ndarray), [raw_itype, alen]
            for _ in range(n):  # strings: a uint64 length, then the bytes
                (length,) = struct.unpack_from("<Q", plain, offs)
                parts.append(plain[offs + 8:offs + 8 + length])
                offs += 8 + length
            return offs - orig_offs, parts, list(range(2, 2 + n)), [array, string]

    _classes.append(Reader)
    return Reader


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"{reader.data.filename}: metadata key {key!r} is missing")
        return default
    return field.contents()


def config_from_gguf(reader) -> ModelConfig:
    """The `ModelConfig` described by a GGUF file's metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{reader.data.filename}: architecture {arch!r} is not supported; "
                         f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}")
    tensors = {t.name: t for t in reader.tensors}
    n_heads = int(_field(reader, f"{arch}.attention.head_count"))
    d_model = int(_field(reader, f"{arch}.embedding_length"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", 0) or
                   _field(reader, f"{arch}.rope.dimension_count", d_model // n_heads))
    vocab = _field(reader, f"{arch}.vocab_size", -1)
    if vocab == -1:
        vocab = int(tensors["token_embd.weight"].shape[1])
    name = str(_field(reader, "general.basename", "gguf")) + "-" + str(_field(reader, "general.size_label", "")).lower()
    return ModelConfig(
        name=name.rstrip("-"),
        vocab_size=int(vocab),
        d_model=d_model,
        n_layers=int(_field(reader, f"{arch}.block_count")),
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        ffn_dim=int(_field(reader, f"{arch}.feed_forward_length")),
        rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_layout=NATIVE_ROPE_LAYOUT[arch],
        # stored as float32 (9.9999997e-06); 7 significant digits give back the 1e-05 that was written
        norm_eps=float(f"{float(_field(reader, f'{arch}.attention.layer_norm_rms_epsilon')):.7g}"),
        max_seq_len=int(_field(reader, f"{arch}.context_length")),
        tie_embeddings="output.weight" not in tensors,
        **(gemma3_fields(reader) if arch == "gemma3" else {}),
    )


def gemma3_fields(reader) -> dict:
    """The config fields in which Gemma 3 differs from Llama (see the module docstring)."""
    n_layers, d_model = int(_field(reader, "gemma3.block_count")), int(_field(reader, "gemma3.embedding_length"))
    window = int(_field(reader, "gemma3.attention.sliding_window"))
    return dict(norm_placement="sandwich", qk_norm=True, activation="gelu_tanh",
                embed_scale=float(np.sqrt(np.float32(d_model))),
                layer_windows=tuple(0 if (i + 1) % GEMMA3_GLOBAL_EVERY == 0 else window for i in range(n_layers)),
                rope_local_base=GEMMA3_LOCAL_ROPE_BASE)


def read_tensor(tensor) -> np.ndarray:
    """Decode one `gguf` ReaderTensor to float32, in PyTorch's [out, in] order."""
    qtype = tensor.tensor_type.name
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest dimension first
    if qtype not in ggml_quants.TYPES:
        raise ValueError(f"tensor {tensor.name!r} has type {qtype}, which labkit does not decode; "
                         f"supported types: {', '.join(ggml_quants.SUPPORTED)}")
    expected = ggml_quants.nbytes(qtype, int(np.prod(shape)))
    if tensor.data.nbytes != expected:
        raise ValueError(f"tensor {tensor.name!r}: {tensor.data.nbytes} bytes stored, {qtype} {shape} needs {expected}")
    return ggml_quants.dequantize(tensor.data, qtype, shape)


def state_dict_from_gguf(reader, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Map and fuse the file's tensors to `Transformer` parameter names (float32)."""
    tensors = {t.name: t for t in reader.tensors}

    def get(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"{reader.data.filename}: tensor {name!r} is missing")
        return torch.from_numpy(read_tensor(tensors[name]))

    state = {"tok_embeddings.weight": get("token_embd.weight"), "norm.weight": get("output_norm.weight")}
    if not config.tie_embeddings:
        state["lm_head.weight"] = get("output.weight")
    for i in range(config.n_layers):
        blk, out = f"blk.{i}.", f"layers.{i}."
        qkv = [get(blk + f"attn_{p}.weight") for p in "qkv"]
        state[out + "attn.wqkv.weight"] = torch.cat(qkv, dim=0)
        state[out + "attn.wo.weight"] = get(blk + "attn_output.weight")
        state[out + "attn_norm.weight"] = get(blk + "attn_norm.weight")
        state[out + "ffn_norm.weight"] = get(blk + "ffn_norm.weight")
        state[out + "mlp.w_gate_up.weight"] = torch.cat([get(blk + "ffn_gate.weight"), get(blk + "ffn_up.weight")], dim=0)
        state[out + "mlp.w_down.weight"] = get(blk + "ffn_down.weight")
        if config.qk_norm:
            state[out + "attn.q_norm.weight"] = get(blk + "attn_q_norm.weight")
            state[out + "attn.k_norm.weight"] = get(blk + "attn_k_norm.weight")
        if config.norm_placement == "sandwich":
            state[out + "post_attn_norm.weight"] = get(blk + "post_attention_norm.weight")
            state[out + "post_ffn_norm.weight"] = get(blk + "post_ffw_norm.weight")
    return state


def to_half_layout(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Permute every layer's Q and K rows from the interleaved to the half RoPE layout."""
    q_out, kv_out = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    for i in range(config.n_layers):
        key = f"layers.{i}.attn.wqkv.weight"
        q, k, v = state[key].split((q_out, kv_out, kv_out), dim=0)
        state[key] = torch.cat([permute_qk_rows(q, config.n_heads), permute_qk_rows(k, config.n_kv_heads), v])
    return state


def load_gguf(path_or_reader, dtype: torch.dtype = torch.float32, rope_layout: str | None = None,
              permute_qk: bool = True) -> Transformer:
    """Build a `Transformer` from a GGUF file (a path or an open `gguf.GGUFReader`).

    `dtype`: float32 (exact, the default) or bfloat16/float16 (half the bytes per step).
    `rope_layout`: None keeps the file's layout; the other one permutes Q/K to match,
    or, with `permute_qk=False`, deliberately does not (a wrong model, for the lesson).
    """
    reader = path_or_reader if hasattr(path_or_reader, "tensors") else open_gguf(path_or_reader)
    config = config_from_gguf(reader)
    state = state_dict_from_gguf(reader, config)
    if rope_layout is not None and rope_layout != config.rope_layout:
        if permute_qk:
            if (config.rope_layout, rope_layout) != ("interleaved", "half"):
                raise ValueError(f"cannot convert rope_layout {config.rope_layout!r} to {rope_layout!r}")
            state = to_half_layout(state, config)
        config = config.replace(rope_layout=rope_layout)
    with torch.device("meta"):
        model = Transformer(config)
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True, assign=True)
    model.eval().requires_grad_(False)
    if dtype == torch.float32:  # the layout each dtype's one-token product is fast in, measured here (see
        model.column_major_()   # `Transformer.column_major_`); bfloat16/float16 stay row-major
    model.source_file = str(reader.data.filename)
    model.tensor_types = {t.name: t.tensor_type.name for t in reader.tensors}
    return model


def format_table(reader) -> list[dict]:
    """One row per GGML type of a file: tensors, weights, bytes, bits per weight, share of the bytes (largest first)."""
    rows: dict[str, dict] = {}
    for t in reader.tensors:
        row = rows.setdefault(t.tensor_type.name, {"type": t.tensor_type.name, "tensors": 0, "weights": 0, "bytes": 0})
        row["tensors"] += 1
        row["weights"] += int(np.prod([int(n) for n in t.shape]))
        row["bytes"] += int(t.data.nbytes)
    total = sum(r["bytes"] for r in rows.values())
    for r in rows.values():
        r["bits_per_weight"] = 8 * r["bytes"] / r["weights"]
        r["share"] = r["bytes"] / total
    return sorted(rows.values(), key=lambda r: -r["bytes"])
