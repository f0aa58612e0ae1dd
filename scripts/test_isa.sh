#!/usr/bin/env bash
# The unit tests whose results depend on which kernels run (batch invariance, speculative exactness, token
# trees, the quantized layers, parity with the reference models (SmolLM2, Gemma 3), the lean step, compressed attention, the compiled
# step: inductor generates code for the emulated instruction set too), once per emulated instruction
# set: AVX2 (a laptop without AVX-512, VNNI, AMX or native bf16) and `default` (no SIMD in ATen's own kernels).
# What it cannot emulate: another vendor's CPU (MKL takes other paths on AMD than on Intel at the same ISA),
# another cache size or core count, or a CPU with fewer features than this one's MKL/oneDNN honour.
# Usage: scripts/test_isa.sh [avx2|default ...]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/isa_env.sh
VENV=${VENV:-.venv}
isas=("$@")
[ ${#isas[@]} -eq 0 ] && isas=(avx2 default)
tests=(tests/test_batch_invariance.py tests/test_speculative_tree.py tests/test_speculative.py
       tests/test_speculative_heads.py tests/test_quant_linear.py tests/test_quant_intdot.py
       tests/test_smollm2_parity.py tests/test_gguf_native.py tests/test_lean_step.py tests/test_model.py
       tests/test_serving_speculative.py tests/test_serving_specload.py tests/test_compressed_attention.py
       tests/test_compiled_step.py tests/test_gemma3.py tests/test_q4q8.py tests/test_exported_step.py
       tests/test_serving_heads.py)
for isa in "${isas[@]}"; do
    vars=$(isa_env "$isa")
    echo "test-isa: $isa ($vars)"
    env $vars "$VENV/bin/python" -c "from labkit.costmodel.cpu import describe; print('test-isa:', describe())"
    env $vars "$VENV/bin/pytest" -q -p no:cacheprovider ${PYTEST_ARGS:-} "${tests[@]}"
done
