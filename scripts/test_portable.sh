#!/usr/bin/env bash
# Do the committed chapter outputs reproduce off the machine that executed them? Re-run chapters under
# nbval in two environments that change the floating-point path:
#   1. one thread (OMP_NUM_THREADS=1): other reduction splits in the BLAS and in labkit's own products;
#   2. a busy CPU: a background process keeps one core loaded (started and stopped here, by PID,
#      bounded in time), as on a laptop with other programs running, with torch's own thread count
#      (LABKIT_THREADS=all: labkit would otherwise run on the free core alone, which run 1 covers): its
#      threads' reductions split as on the machine that executed the chapters. Threads that spin at a
#      barrier for a descheduled partner made a chapter 8-12x slower (a GPTQ run 8 s quiet, 67 s busy), so
#      this run lets them sleep (OMP_WAIT_POLICY=PASSIVE: 18 s busy), within PORTABLE_BUSY_LIMIT_S.
#   3. an AVX2 CPU (no AVX-512, VNNI, AMX or native bf16), emulated: ATen, MKL and oneDNN capped at AVX2;
#   4. no SIMD in ATen's own kernels (`default`; MKL at SSE4.2, oneDNN at SSE4.1): for correctness only,
#      some chapters run several times slower there.
# All must pass. What the emulation cannot show: another vendor's MKL path, cache sizes, a CPU whose
# integer or bf16 kernels are slower than this one's at the same instruction set (README). Usage: scripts/test_portable.sh [chapter.ipynb ...]   (default: every chapter)
#                        PORTABLE_ROTATE=1 scripts/test_portable.sh      (one chapter, by commit count)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/isa_env.sh
VENV=${VENV:-.venv}
chapters=("$@")
if [ ${#chapters[@]} -eq 0 ]; then
    chapters=(notebooks/[0-9]*.ipynb)
    if [ -n "${PORTABLE_ROTATE:-}" ]; then  # one chapter per run, the next one at the next commit
        n=$(git rev-list --count HEAD 2>/dev/null || date +%j)
        chapters=("${chapters[$((10#$n % ${#chapters[@]}))]}")
    fi
fi
flags=(--nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg -p no:cacheprovider -q ${PYTEST_ARGS:-})
limit=${PORTABLE_BUSY_LIMIT_S:-3600}

"$VENV/bin/python" -c "from labkit.costmodel.cpu import describe; print('portable: on', describe())"
echo "portable 1/4: one thread (OMP_NUM_THREADS=1) on ${chapters[*]}"
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$VENV/bin/pytest" "${flags[@]}" "${chapters[@]}"

echo "portable 2/4: one core kept busy by a background process, the run at most ${limit} s, on ${chapters[*]}"
timeout "$((limit + 30))" "$VENV/bin/python" -c "while True: pass" &
busy=$!
trap 'kill "$busy" 2>/dev/null || true; wait "$busy" 2>/dev/null || true' EXIT
rc=0
env -u OMP_NUM_THREADS -u MKL_NUM_THREADS LABKIT_THREADS=all OMP_WAIT_POLICY=PASSIVE timeout "$limit" "$VENV/bin/pytest" "${flags[@]}" "${chapters[@]}" || rc=$?
kill "$busy" 2>/dev/null || true
if [ "$rc" -eq 124 ]; then
    echo "portable 2/4: the busy-core run passed its limit of ${limit} s (PORTABLE_BUSY_LIMIT_S)" >&2
fi
[ "$rc" -eq 0 ] || exit "$rc"

for isa in avx2 default; do
    n=$([ "$isa" = avx2 ] && echo 3 || echo 4)
    echo "portable $n/4: instruction set $isa emulated ($(isa_env "$isa")) on ${chapters[*]}"
    env $(isa_env "$isa") "$VENV/bin/pytest" "${flags[@]}" "${chapters[@]}"
done
echo "portable: the chapters' stored outputs reproduce with one thread, a busy CPU, AVX2 and no SIMD"
