// optim.cpp: CPU kernel of the optim family: adamw_step, the AdamW update of one parameter.
//
// in = {w, g, m, v} (f32 or f64, contiguous, one shape), attrs.reals = {decay, b1, b2, eps,
// step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t)} -> out = {w', m', v'} (with
// attrs.flag, written over w, m and v and returned as those tensors: each element is read
// before it is written, by the same iteration; in[4], when present, a bf16/f16 parameter whose
// f32 master w is, receives w' rounded once to nearest-even, in the same pass; with an f32 w the
// gradient g may be bf16/f16, widened exactly as it is read):
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
#include "taper/kernel_checks.h"

namespace taper::cpu {
namespace {

template <class T, class G, class H>
void adamw_range(const T* w, const G* g, const T* m, const T* v, T* wo, T* mo, T* vo, H* ho,
                 size_t b, size_t e, const std::vector<double>& r) {
  const T decay = T(r[0]), c1 = T(1.0 - r[1]), b2 = T(r[2]), c2 = T(1.0 - r[2]), eps = T(r[3]),
          step = T(r[4]), bc2 = T(r[5]);
  for (size_t i = b; i < e; ++i) {
    const T gi = static_cast<T>(g[i]);  // a half gradient widens exactly
    const T mi = m[i] + (gi - m[i]) * c1;
    const T vi = v[i] * b2 + (gi * gi) * c2;
    mo[i] = mi;
    vo[i] = vi;
    const T wi = w[i] * decay - (mi / (std::sqrt(vi) / bc2 + eps)) * step;
    wo[i] = wi;
    if constexpr (!std::is_same_v<H, T>) ho[i] = cast_value<H>(wi);
  }
}

std::vector<Tensor> adamw_step_kernel(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  check_adamw_step(in, attrs);
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
      auto run = [&](auto* grad, auto* half) {
        using G = std::remove_const_t<std::remove_pointer_t<decltype(grad)>>;
        using H = std::remove_pointer_t<decltype(half)>;
        parallel_for(n, size_t(1) << 16, [&](size_t b, size_t e) {
          adamw_range<T, G, H>(in[0].data<T>(), grad, in[2].data<T>(), in[3].data<T>(),
                               out[0].data<T>(), out[1].data<T>(), out[2].data<T>(), half, b, e,
                               attrs.reals);
        });
      };
      auto with_grad = [&](auto* half) {
        if (in[1].dtype() == DType::BF16) run(in[1].data<bf16>(), half);
        else if (in[1].dtype() == DType::F16) run(in[1].data<f16>(), half);
        else run(in[1].data<T>(), half);
      };
      if (!present(in, 4)) with_grad(static_cast<T*>(nullptr));
      else if (in[4].dtype() == DType::BF16) with_grad(in[4].data<bf16>());
      else with_grad(in[4].data<f16>());
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
