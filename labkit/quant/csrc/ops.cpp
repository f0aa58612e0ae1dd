// The block kernels as torch operators (torch.library), so eager code, Inductor and AOTInductor call them:
//   labkit::q4q8_mm(x, codes, dw, mw, path)   Q4_1 weights (q4q8.cpp)
//   labkit::q8q8_mm(x, codes, dw, path)       Q8_0 weights (q8q8.cpp)
//   labkit::q4q8_paths()                      the paths this CPU can run, a bit mask
// Each quantizes the rows of x [M, K] once (blocks.h), then splits the groups of 16 output rows
// over torch's threads; input rows go 16 at a time through each group's unpacked blocks.
#include "blocks.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace labkit_kernels {
namespace {

using Group = void (*)(int64_t, const Args&, int64_t, int64_t, int64_t);

at::Tensor block_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& dw, const at::Tensor* mw,
                    int64_t path, int64_t chunks, Group group) {
  TORCH_CHECK_VALUE(path >= PORTABLE && path <= AVX512_VNNI, "path must be 0 (portable), 1 (AVX2) or 2 (AVX-512 VNNI), got ", path);
  TORCH_CHECK_VALUE(cpu_has(path), "path ", path, " needs instructions this CPU lacks");
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat && x.dim() == 2, "x must be a float32 matrix [M, K]");
  TORCH_CHECK_TYPE(codes.dim() == 5 && codes.size(2) == chunks && codes.size(3) == ROWS && codes.size(4) == 4,
                   "codes must be [groups, nb, ", chunks, ", 16, 4]");
  TORCH_CHECK_TYPE(codes.scalar_type() == at::kByte || codes.scalar_type() == at::kChar, "codes must be 8-bit");
  TORCH_CHECK_TYPE(dw.scalar_type() == at::kHalf && (mw == nullptr || mw->scalar_type() == at::kHalf), "steps must be float16");
  const int64_t M = x.size(0), K = x.size(1), groups = codes.size(0), nb = codes.size(1);
  TORCH_CHECK_VALUE(K == nb * BLOCK, "x has ", K, " features, the weight ", nb * BLOCK);
  TORCH_CHECK_VALUE(dw.numel() == groups * nb * ROWS && (mw == nullptr || mw->numel() == groups * nb * ROWS),
                    "steps must be [groups, nb, 16]");
  const at::Tensor xc = x.contiguous(), cc = codes.contiguous(), dc = dw.contiguous();
  const at::Tensor mc = mw == nullptr ? dc : mw->contiguous();
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor dx = at::empty({M, nb}, x.options()), sx = at::empty({M, nb}, x.options());
  at::Tensor xsum = at::empty({M, nb}, x.options().dtype(at::kInt));
  at::Tensor out = at::empty({M, groups * ROWS}, x.options());
  if (M == 0) return out;
  quantize_rows(xc.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), dx.data_ptr<float>(), sx.data_ptr<float>(),
                xsum.data_ptr<int32_t>());
  const Args a{static_cast<const uint8_t*>(cc.data_ptr()), dc.data_ptr<c10::Half>(), mc.data_ptr<c10::Half>(),
               q.data_ptr<int8_t>(), dx.data_ptr<float>(), sx.data_ptr<float>(), xsum.data_ptr<int32_t>(),
               out.data_ptr<float>(), M, K, nb, groups * ROWS};
  at::parallel_for(0, groups, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g)
      for (int64_t m0 = 0; m0 < M; m0 += MAX_M) group(path, a, g, m0, std::min(MAX_M, M - m0));
  });
  return out;
}

at::Tensor q4q8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& dw, const at::Tensor& mw,
                   int64_t path) {
  return block_mm(x, codes, dw, &mw, path, 4, q4_group);
}

at::Tensor q8q8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& dw, int64_t path) {
  return block_mm(x, codes, dw, nullptr, path, 8, q8_group);
}

int64_t q4q8_paths() {
  int64_t mask = 0;
  for (int64_t p = PORTABLE; p <= AVX512_VNNI; ++p)
    if (cpu_has(p)) mask |= int64_t(1) << p;
  return mask;
}

}  // namespace
}  // namespace labkit_kernels

TORCH_LIBRARY(labkit, m) {
  m.def("q4q8_mm(Tensor x, Tensor codes, Tensor dw, Tensor mw, int path) -> Tensor");
  m.def("q8q8_mm(Tensor x, Tensor codes, Tensor dw, int path) -> Tensor");
  m.def("q4q8_paths() -> int", &labkit_kernels::q4q8_paths);
}

TORCH_LIBRARY_IMPL(labkit, CPU, m) {
  m.impl("q4q8_mm", &labkit_kernels::q4q8_mm);
  m.impl("q8q8_mm", &labkit_kernels::q8q8_mm);
}
