// ckpt_compare.cpp: `taper_ckpt_compare A B TOL [PREFIX] [--skip SUBSTR]...`: compares two
// safetensors files tensor by tensor, as tests/finetune_ddp.sh needs (a fine-tune on N
// processes against one process).
//
// What it is: for each float tensor whose name starts with PREFIX (all when not given), the
// relative difference ||a - b||_2 / ||a||_2 (in f64; 0 when both are zero) and the largest
// elementwise |a - b|; integer tensors must be equal. Tensors whose name contains a --skip
// substring are reported but do not fail. Prints the worst tensors and exits 1 when the names
// differ or a relative difference is above TOL.
// What it is not: a test of its own (a helper program of a ctest script).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "taper/nn/safetensors.h"
#include "taper/taper.h"

using namespace taper;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: taper_ckpt_compare A B TOL [PREFIX] [--skip SUBSTR]...\n");
    return 2;
  }
  std::string prefix;
  std::vector<std::string> skip;
  for (int i = 4; i < argc; ++i) {
    if (std::string(argv[i]) == "--skip" && i + 1 < argc) skip.push_back(argv[++i]);
    else prefix = argv[i];
  }
  try {
    const safetensors::File a = safetensors::File::open(argv[1]);
    const safetensors::File b = safetensors::File::open(argv[2]);
    const double tol = std::atof(argv[3]);
    std::vector<std::string> na = a.names(), nb = b.names();
    std::sort(na.begin(), na.end());
    std::sort(nb.begin(), nb.end());
    if (na != nb) {
      std::printf("FAIL: the files hold different tensors (%zu vs %zu)\n", na.size(), nb.size());
      return 1;
    }
    std::vector<std::pair<double, std::string>> rel;
    double worst_abs = 0.0;
    bool ok = true;
    for (const std::string& n : na) {
      if (n.rfind(prefix, 0) != 0) continue;
      const Tensor x = a.get(n), y = b.get(n);
      if (x.shape() != y.shape() || x.dtype() != y.dtype()) {
        std::printf("FAIL: %s: %s %s vs %s %s\n", n.c_str(), x.shape().to_string().c_str(),
                    std::string(dtype_name(x.dtype())).c_str(), y.shape().to_string().c_str(),
                    std::string(dtype_name(y.dtype())).c_str());
        ok = false;
        continue;
      }
      const std::vector<double> u = x.to_dtype(DType::F64).to_vector<double>();
      const std::vector<double> v = y.to_dtype(DType::F64).to_vector<double>();
      if (!is_float(x.dtype())) {
        if (u != v) {
          std::printf("FAIL: %s: integer values differ\n", n.c_str());
          ok = false;
        }
        continue;
      }
      double d2 = 0.0, a2 = 0.0, dmax = 0.0;
      for (size_t i = 0; i < u.size(); ++i) {
        d2 += (u[i] - v[i]) * (u[i] - v[i]);
        a2 += u[i] * u[i];
        dmax = std::max(dmax, std::abs(u[i] - v[i]));
      }
      const double r = d2 == 0.0 ? 0.0 : std::sqrt(d2) / std::sqrt(a2);
      const bool skipped = std::any_of(skip.begin(), skip.end(), [&](const std::string& k) {
        return n.find(k) != std::string::npos;
      });
      rel.emplace_back(skipped ? -r : r, skipped ? n + " (skipped)" : n);
      if (skipped) continue;
      worst_abs = std::max(worst_abs, dmax);
      if (!(r <= tol)) ok = false;
    }
    std::sort(rel.begin(), rel.end(), [](const auto& p, const auto& q) {
      return std::abs(p.first) > std::abs(q.first);
    });
    std::printf("%zu tensors compared; largest |a - b| %.3g (not skipped); largest relative L2 "
                "differences:\n", rel.size(), worst_abs);
    size_t shown = 0;
    for (const auto& [r, n] : rel) {
      if (r >= 0 && shown == 3) continue;  // every skipped one, and the worst 3 others
      if (r >= 0) ++shown;
      std::printf("  %-70s %.3g\n", n.c_str(), std::abs(r));
    }
    std::printf("%s: tolerance %g\n", ok ? "OK" : "FAIL", tol);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "taper_ckpt_compare: %s\n", e.what());
    return 2;
  }
}
