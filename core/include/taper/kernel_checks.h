// kernel_checks.h: operand checks that every device's kernel of an op runs, for ops that have
// no front-end of their own to check them (dispatch checks devices and the first input's dtype
// only). One copy here, so the CPU and CUDA kernels refuse the same operands with the same Error.
#pragma once

#include <vector>

#include "taper/error.h"
#include "taper/op.h"

namespace taper {

/// adamw_step's operands (op.h): 6 scalars; a gradient of the parameter's dtype, or bf16/f16
/// beside an f32 master; the optional fifth input a bf16/f16 tensor of the master's shape
/// beside an f32 master.
inline void check_adamw_step(const std::vector<Tensor>& in, const OpAttrs& attrs) {
  TAPER_CHECK(attrs.reals.size() == 6, "adamw_step: needs 6 scalars, got ", attrs.reals.size());
  const Tensor& w = in[0];
  TAPER_CHECK(!present(in, 4) || (w.dtype() == DType::F32 && is_half(in[4].dtype()) &&
                                  in[4].shape() == w.shape()),
              "adamw_step: the rounded parameter must be a bf16/f16 ", w.shape().to_string(),
              " beside an f32 master, got ", dtype_name(in[4].dtype()), " ",
              in[4].shape().to_string(), " beside ", dtype_name(w.dtype()));
  TAPER_CHECK(in[1].dtype() == w.dtype() || (w.dtype() == DType::F32 && is_half(in[1].dtype())),
              "adamw_step: a ", dtype_name(in[1].dtype()), " gradient for a ",
              dtype_name(w.dtype()), " parameter (it must be the parameter's dtype, or bf16/f16 "
              "for an f32 master)");
}

}  // namespace taper
