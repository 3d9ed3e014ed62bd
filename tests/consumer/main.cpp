// Uses the installed taper: a fused op and its gradient.
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
  if (!dx || std::abs(s - 4.0) > 1e-4) {
    std::cerr << "consumer: unexpected result\n";
    return 1;
  }
  std::cout << "consumer: ok, softmax rows sum to " << s << "\n";
  return 0;
}
