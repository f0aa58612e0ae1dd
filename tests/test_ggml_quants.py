"""labkit's GGML block formats are byte-exact against the `gguf` package (llama.cpp's reference port)."""
import numpy as np
import pytest

from labkit.quant import ggml as lq
from tests.smollm2_shared import reader

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants as gq  # noqa: E402

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "F16", "F32"]


def _random_rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((48, 256)).astype(np.float32)
    x *= rng.uniform(1e-3, 50, size=(48, 1)).astype(np.float32)  # very different block scales
    x[0, :32] = 0  # an all-zero block: d = 0
    x[1, :32] = 7.25  # a constant block: max == min
    x[2, :32] = np.linspace(-1, 1, 32)
    x[3] = rng.integers(-3, 4, 256)  # exact small integers
    x[4, :32] = -x[4, :32].__abs__()  # all negative
    return x


def _same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_and_dequantize_match_gguf_on_random_data(qtype, seed):
    x = _random_rows(seed)
    ours, ref = lq.quantize(x, qtype), gq.quantize(x, T[qtype])
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert ours.tobytes() == ref.tobytes()
    assert _same_floats(lq.dequantize(ours, qtype, x.shape), gq.dequantize(ref, T[qtype]).reshape(x.shape))


def test_reference_vectors_from_the_research_notes():
    x = np.arange(32, dtype=np.float32)
    assert lq.quantize(x, "Q4_0").tobytes().hex() == "c0c348483737373726262626151515150404"
    assert lq.quantize(x, "Q4_1").tobytes().hex() == "2240000080809191a2a2b3b3c4c4d5d5e6e6f7f7"
    assert lq.quantize(x, "Q8_0").tobytes().hex().startswith("d0330004080c1014191d")
    lin = np.linspace(-1, 1, 32, dtype=np.float32)
    assert lq.quantize(lin, "Q4_0").tobytes().hex() == "0030809191a2a2b3b3c4c4d5d5e6e6f7f7f8"


def test_q5_0_fifth_bit_is_bit_j_of_the_little_endian_word():
    x = np.zeros(32, dtype=np.float32)
    x[0], x[3] = -16.0, 15.0  # d = 1: codes 0 (weight 0) and 31 (weight 3); the rest code 16
    q = lq.quantize(x, "Q5_0")
    word = int.from_bytes(q[2:6].tobytes(), "little")
    assert word == (0xFFFFFFFF & ~1)  # every code >= 16 but weight 0's has its fifth bit set
    assert q[6] == 0x00 and q[9] == 0x0F  # byte j: weight j low (0, 15), weight j + 16 high (code 16: nibble 0)
    assert lq.dequantize(q, "Q5_0")[[0, 3, 5]].tolist() == [-16.0, 15.0, 0.0]


def test_round_half_away_from_zero_not_to_even():
    # Q8_0 codes round like C's roundf: 0.5 -> 1, 2.5 -> 3 (numpy's round would give 0 and 2)
    x = np.zeros(32, dtype=np.float32)
    x[:4] = [127.0, 0.5, 2.5, -2.5]  # d = 1 exactly
    codes = lq.quantize(x, "Q8_0")[2:6].view(np.int8).tolist()
    assert codes == [127, 1, 3, -3]
    x[1] = np.nextafter(np.float32(0.5), np.float32(0))  # just below one half: rounds down
    assert lq.quantize(x, "Q8_0")[3].view(np.int8) == 0


def test_nibble_layout_low_is_first_half():
    x = np.zeros(32, dtype=np.float32)
    x[0], x[16] = 15.0, 0.0  # Q4_1: min 0, d = 1
    x[1] = 15.0
    q = lq.quantize(x, "Q4_1")
    assert q[4] == 0x0F and q[5] == 0x0F  # weight j in the low nibble of byte j, weight j+16 in its high nibble


def test_dequantize_every_tensor_of_the_real_file_like_gguf():
    seen = set()
    for t in reader().tensors:
        seen.add(t.tensor_type.name)
        assert _same_floats(lq.dequantize(t.data, t.tensor_type.name), gq.dequantize(t.data, t.tensor_type)), t.name
    assert seen == {"Q4_1", "Q8_0", "F32"}


def test_requantizing_every_tensor_gives_back_the_file_bytes():
    """The file was written by llama.cpp's C quantizer: labkit's quantize(dequantize(bytes)) reproduces it."""
    for t in reader().tensors:
        qtype = t.tensor_type.name
        if qtype != "F32":
            assert lq.quantize(lq.dequantize(t.data, qtype), qtype).tobytes() == np.asarray(t.data).tobytes(), t.name


def test_quantize_real_weights_like_gguf():
    # gguf's numpy quantizer is slow, so it sees the embedding and the first and last block
    names = ("token_embd.weight", "blk.0.", "blk.29.")
    for t in reader().tensors:
        if t.tensor_type.name != "F32" and t.name.startswith(names):
            x = lq.dequantize(t.data, t.tensor_type.name)
            assert lq.quantize(x, t.tensor_type.name).tobytes() == gq.quantize(x, t.tensor_type).tobytes(), t.name


def test_sizes_and_bad_input():
    assert lq.bits_per_weight("Q4_1") == 5.0 and lq.bits_per_weight("Q8_0") == 8.5 and lq.bits_per_weight("Q4_0") == 4.5
    assert lq.nbytes("Q4_1", 576 * 576) == 576 * 18 * 20
    assert lq.bits_per_weight("Q5_0") == 5.5 and lq.bits_per_weight("Q4_K") == 4.5 and lq.bits_per_weight("Q6_K") == 6.5625
    with pytest.raises(ValueError, match="Q2_K.*supported types: F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K"):
        lq.quantize(np.zeros(32, np.float32), "Q2_K")
    with pytest.raises(ValueError, match="multiple of 32"):
        lq.quantize(np.zeros(33, np.float32), "Q8_0")
    with pytest.raises(ValueError, match="not a whole number of blocks"):
        lq.dequantize(np.zeros(35, np.uint8), "Q8_0")
