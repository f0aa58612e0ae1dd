# Sourced by the test scripts: isa_env NAME prints the environment that makes torch, MKL and oneDNN
# use a smaller instruction set than this CPU has (labkit.costmodel.cpu.ISA_EMULATION says the same).
#   avx2:    ATen's AVX2 kernels, MKL and oneDNN capped at AVX2 (no AVX-512, VNNI, AMX or native bf16)
#   default: ATen's kernels without explicit vectorisation, MKL capped at SSE4.2, oneDNN at SSE4.1
isa_env() {
    case "$1" in
        avx2)    echo "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2" ;;
        default) echo "ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41" ;;
        *) echo "isa_env: unknown instruction set '$1' (avx2 or default)" >&2; return 1 ;;
    esac
}
