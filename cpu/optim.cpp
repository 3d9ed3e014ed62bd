// optim.cpp: CPU kernel of the optim family: adamw_step, the AdamW update of one parameter.
//
// in = {w, g, m, v} (f32 or f64, contiguous, one shape), attrs.reals = {decay, b1, b2, eps,
// step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t)} -> out = {w', m', v'} (with
// attrs.flag, written over w, m and v and returned as those tensors: each element is read
// before it is written, by the same iteration):
//   m' = m + (g - m) (1 - b1),  v' = v b2 + (g g) (1 - b2),
//   w' = w decay - (m' / (sqrt(v') / bc2_sqrt + eps)) step_size,
// each scalar rounded to the dtype and each operation rounded in that order, exactly as the
// composed form (metal_fallback/composed.cpp) and the CUDA kernel compute it, so every path gives
// the same bits. One pass: 4 reads and 3 writes per element, split over taper's thread pool by
// element ranges (the same bits whatever the thread count).
// What it is not: the optimizer's bookkeeping (nn/src/optim.cpp: master weights, bias
// corrections, state dicts).
#include <cmath>
#include <vector>

#include "cpu/cpu_common.h"

namespace taper::cpu {
namespace {

template <class T>
void adamw_range(const T* w, const T* g, const T* m, const T* v, T* wo, T* mo, T* vo, size_t b,
                 size_t e, const std::vector<double>& r) {
  const T decay = T(r[0]), c1 = T(1.0 - r[1]), b2 = T(r[2]), c2 = T(1.0 - r[2]), eps = T(r[3]),
          step = T(r[4]), bc2 = T(r[5]);
  for (size_t i = b; i < e; ++i) {
    const T gi = g[i];
    const T mi = m[i] + (gi - m[i]) * c1;
    const T vi = v[i] * b2 + (gi * gi) * c2;
    mo[i] = mi;
    vo[i] = vi;
    wo[i] = w[i] * decay - (mi / (std::sqrt(vi) / bc2 + eps)) * step;
  }
}

std::vector<Tensor> adamw_step_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  TAPER_ASSERT(attrs.reals.size() == 6);
  const Tensor& w = in[0];
  std::vector<Tensor> out;
  if (attrs.flag)
    out = {in[0], in[2], in[3]};
  else
    for (int k = 0; k < 3; ++k) out.push_back(Tensor::empty(w.shape(), w.dtype(), w.device()));
  const size_t n = w.elem_count();
  visit_dtype(w.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      parallel_for(n, size_t(1) << 16, [&](size_t b, size_t e) {
        adamw_range<T>(in[0].data<T>(), in[1].data<T>(), in[2].data<T>(), in[3].data<T>(),
                       out[0].data<T>(), out[1].data<T>(), out[2].data<T>(), b, e, attrs.reals);
      });
    }
  });
  return out;
}

struct OptimRegistrar {
  OptimRegistrar() {
    register_kernel(OpId::adamw_step, DeviceKind::Cpu, dtype_bit(DType::F32) | dtype_bit(DType::F64),
                    &adamw_step_kernel, /*needs_contiguous=*/true);
  }
};
const OptimRegistrar g_optim_registrar;

}  // namespace
}  // namespace taper::cpu
