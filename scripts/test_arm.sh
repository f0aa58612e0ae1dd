#!/usr/bin/env bash
# make test-arm: the block kernels' arithmetic (labkit/quant/csrc, no torch) against a plain reference, bit for bit,
# on every path: natively (portable, AVX2, AVX-512 VNNI where this CPU has them), then cross-compiled for ARM and run
# under qemu-user: -cpu max (the NEON dot product) and -cpu cortex-a53 (Armv8.0: portable only).
# Needs g++, g++-aarch64-linux-gnu and qemu-user (Debian: apt-get install g++-aarch64-linux-gnu qemu-user).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.build/test-arm
mkdir -p "$out"
src=(tests/kernels/test_blocks.cpp labkit/quant/csrc/q4q8.cpp labkit/quant/csrc/q8q8.cpp)
flags=(-O2 -std=c++20 -ffp-contract=off -Wall -Wno-maybe-uninitialized)  # GCC 12 warns inside its own AVX-512 headers
CXX_ARM=${CXX_ARM:-aarch64-linux-gnu-g++}
for tool in "${CXX:-g++}" "$CXX_ARM" qemu-aarch64; do
    if ! command -v "$tool" > /dev/null; then
        echo "test-arm: $tool is missing (Debian: apt-get update && apt-get install g++ g++-aarch64-linux-gnu qemu-user)" >&2
        exit 2
    fi
done
echo "== native ($(uname -m))"
"${CXX:-g++}" "${flags[@]}" "${src[@]}" -o "$out/test_blocks"
"$out/test_blocks"
echo "== aarch64 under qemu, -cpu max (NEON dot product)"
"$CXX_ARM" "${flags[@]}" -static "${src[@]}" -o "$out/test_blocks_arm"
qemu-aarch64 -cpu max "$out/test_blocks_arm"
echo "== aarch64 under qemu, -cpu cortex-a53 (no dot product)"
qemu-aarch64 -cpu cortex-a53 "$out/test_blocks_arm"
