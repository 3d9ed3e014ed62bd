// Uses the installed taper: a fused op, its gradient, and its composed form (taper/composed.h,
// installed from metal_fallback/ beside core's headers).
#include <taper/composed.h>
#include <taper/taper.h>

#include <cmath>
#include <iostream>

int main() {
  using namespace taper;
  Var x = Var::from_tensor(Tensor::randn({4, 16}, DType::F32, Device::cpu(), 1));
  Tensor y = ops::softmax_last_dim(x);
  GradStore g = (y * y).sum_all().backward();
  auto dx = g.get(x);
  const double s = y.sum_all().item();
  const double diff = (y - composed::softmax_last_dim(x)).abs().max({}).item();
  if (!dx || std::abs(s - 4.0) > 1e-4 || !(diff < 1e-6)) {
    std::cerr << "consumer: unexpected result\n";
    return 1;
  }
  std::cout << "consumer: ok, softmax rows sum to " << s << ", fused and composed agree\n";
  return 0;
}
