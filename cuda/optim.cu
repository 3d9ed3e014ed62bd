// optim.cu: CUDA kernel of the optim family: adamw_step, the AdamW update of one parameter, the
// same operations in the same order as cpu/optim.cpp (which states the formula), so the GPU
// gives the CPU's bits (sqrt and / are correctly rounded; --fmad=false keeps every product and
// sum rounded on its own). One pass: 4 reads and 3 writes per element; in place (attrs.flag)
// the outputs are w, m and v themselves (so the pointers carry no __restrict__: each element is
// read before the same thread writes it). in[4], when present, is the bf16/f16 parameter of the
// f32 master w: it receives w' rounded once, in the same pass (cast_value, the CPU's rounding);
// with an f32 w the gradient may be bf16/f16, widened exactly as it is read.
#include "cuda/cuda_common.cuh"
#include "taper/kernel_checks.h"

namespace taper::cuda {
namespace {

template <class T> struct AdamWScalars {
  T decay, c1, b2, c2, eps, step, bc2;
};

template <class T, class G, class H>
__global__ void adamw_kernel(const T* w, const G* __restrict__ g, const T* m, const T* v, T* wo,
                             T* mo, T* vo, H* __restrict__ ho, int64_t n, AdamWScalars<T> s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T gi = static_cast<T>(g[i]), mi0 = m[i];  // a half gradient widens exactly
    const T mi = mi0 + (gi - mi0) * s.c1;
    const T vi = v[i] * s.b2 + (gi * gi) * s.c2;
    mo[i] = mi;
    vo[i] = vi;
    const T wi = w[i] * s.decay - (mi / (sqrt(vi) / s.bc2 + s.eps)) * s.step;
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
    for (int k = 0; k < 3; ++k) out.push_back(new_output(w.shape(), w.dtype(), w));
  const int64_t n = static_cast<int64_t>(w.elem_count());
  if (n == 0) return out;
  const int dev = w.device().ordinal();
  const std::vector<double>& r = attrs.reals;
  visit_dtype(w.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const AdamWScalars<T> s{T(r[0]), T(1.0 - r[1]), T(r[2]), T(1.0 - r[2]), T(r[3]), T(r[4]),
                              T(r[5])};
      auto run = [&](auto* grad, auto* half) {
        using G = std::remove_const_t<std::remove_pointer_t<decltype(grad)>>;
        using H = std::remove_pointer_t<decltype(half)>;
        adamw_kernel<T, G, H>
            <<<grid_for(static_cast<size_t>(n), dev), kThreads, 0, stream(dev)>>>(
                ptr<T>(in[0]), grad, ptr<T>(in[2]), ptr<T>(in[3]), ptr<T>(out[0]),
                ptr<T>(out[1]), ptr<T>(out[2]), half, n, s);
      };
      auto with_grad = [&](auto* half) {
        if (in[1].dtype() == DType::BF16) run(ptr<bf16>(in[1]), half);
        else if (in[1].dtype() == DType::F16) run(ptr<f16>(in[1]), half);
        else run(ptr<T>(in[1]), half);
      };
      if (!present(in, 4)) with_grad(static_cast<T*>(nullptr));
      else if (in[4].dtype() == DType::BF16) with_grad(ptr<bf16>(in[4]));
      else with_grad(ptr<f16>(in[4]));
      TAPER_CUDA_CHECK_LAUNCH("adamw_step", in);
    }
  });
  return out;
}

struct OptimRegistrar {
  OptimRegistrar() {
    register_kernel(OpId::adamw_step, DeviceKind::Cuda,
                    dtype_bit(DType::F32) | dtype_bit(DType::F64), &adamw_step_kernel,
                    /*needs_contiguous=*/true);
  }
};
const OptimRegistrar g_optim_registrar;

}  // namespace
}  // namespace taper::cuda
