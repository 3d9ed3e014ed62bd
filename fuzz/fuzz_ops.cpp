// fuzz_ops.cpp: libFuzzer target for op sequences on the CPU device: the fuzz input is decoded
// into a small program of tensor creations (every dtype; shapes with zero, small, and now and
// then absurd sizes), views (narrow, transpose, permute, reshape, broadcast_as, unsqueeze,
// squeeze, ...), ops (unary, binary, comparisons, where, mul_add, reductions, matmul, index ops,
// cat/stack, the fused softmax and norms and their composed forms, the nn losses and layers)
// and backward passes through what it built.
//
// The promise checked: every call gives a taper::Error or a result, never a crash, a sanitizer
// report or another exception type; and every result is well formed: its element count is the
// product of its dims (no wrap-around), its layout stays inside its storage, and a gradient has
// its leaf's shape and dtype. Allocations stay bounded: tensors kept for later steps hold at most
// kMaxElems elements and an op is asked for at most kMaxOut, except absurd requests (element or
// byte counts that overflow, or more bytes than any machine has), which must be refused.
//
// Environment:
//   TAPER_FUZZ_TRACE=1       print each step as C++-like pseudo code (to shrink a reproducer by
//   hand) TAPER_FUZZ_SKIP=a,b,...  step names to skip (e.g. a known crash class, to find the next
//   one);
//                            "absurd" skips absurd sizes, "zero_huge" only those in shapes that
//                            also hold a 0, "backward" every backward pass, "layout" the result
//                            checks; Program::steps() lists the step names, and step_unary's
//                            table the unary op names, which may be skipped one by one.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "taper/composed.h"
#include "taper/nn/functional.h"
#include "taper/nn/loss.h"
#include "taper/nn/optim.h"
#include "taper/taper.h"

extern "C" void __sanitizer_set_death_callback(void (*callback)(void));

using namespace taper;

namespace {

constexpr size_t kMaxElems = size_t(1) << 16;       // largest tensor kept or created on purpose
constexpr size_t kMaxOut = 4 * kMaxElems;           // largest result an op is asked for
constexpr size_t kMaxMatmulWork = size_t(1) << 22;  // batch * m * n * k
constexpr size_t kAbsurdBytes = size_t(1) << 41;    // above ASan's largest allocation (1 TiB)
constexpr size_t kMaxPool = 8;
constexpr size_t kMaxSteps = 24;

constexpr DType kDTypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16,
                             DType::I64, DType::U32, DType::U8};

// The element count of `dims`, or nullopt when it does not fit in size_t (a 0 anywhere gives 0).
std::optional<size_t> product(const std::vector<size_t>& dims) {
  if (std::find(dims.begin(), dims.end(), 0) != dims.end()) return 0;
  size_t n = 1;
  for (size_t d : dims)
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

// The product of the nonzero dims: the most elements an op can make from a tensor of `dims`
// (a sum over the 0 of (2^40, 0) gives 2^40 zeros), nullopt when it does not fit in size_t.
std::optional<size_t> reach(const std::vector<size_t>& dims) {
  size_t n = 1;
  for (size_t d : dims)
    if (d && __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

bool fits(const std::vector<size_t>& dims, size_t limit = kMaxOut) {
  const auto n = product(dims);
  return n && *n <= limit;
}

std::string shape_str(const std::vector<size_t>& d) { return Shape(d).to_string(); }

std::string describe(const Tensor& t) {
  return detail::str_cat(dtype_name(t.dtype()), shape_str(t.dims()),
                         t.is_contiguous() ? "" : " strided", t.tracks_grad() ? " grad" : "");
}

// The step names TAPER_FUZZ_SKIP may hold.
const std::set<std::string>& skipped() {
  static const std::set<std::string> s = [] {
    std::set<std::string> out;
    if (const char* e = std::getenv("TAPER_FUZZ_SKIP")) {
      std::stringstream ss(e);
      std::string item;
      while (std::getline(ss, item, ',')) out.insert(item);
    }
    return out;
  }();
  return s;
}
bool skip(const std::string& name) { return skipped().count(name) != 0; }
const bool kTrace = [] {
  const char* e = std::getenv("TAPER_FUZZ_TRACE");
  return e && *e && *e != '0';
}();

std::string g_last_step;  // printed when a sanitizer ends the process
void on_death() {
  if (!g_last_step.empty()) std::fprintf(stderr, "fuzz_ops: last step: %s\n", g_last_step.c_str());
}

class Program {
 public:
  explicit Program(fuzz::Choices& in) : in_(in) {}

  void run() {
    const size_t n0 = 1 + in_.below(3);
    for (size_t i = 0; i < n0; ++i) fuzz::guarded("new", [&] { step_new(); });
    if (pool_.empty())
      apply("Tensor::randn({2, 3})", [&] { return Tensor::randn({2, 3}, DType::F32); });
    for (size_t s = 0; s < kMaxSteps && !in_.empty(); ++s) {
      const size_t k = in_.below(steps().size());
      const std::string& name = steps()[k].first;
      const Step fn = steps()[k].second;
      if (skip(name)) continue;
      g_last_step = name;
      fuzz::guarded(name.c_str(), [&] { (this->*fn)(); });
    }
    if (!skip("backward"))
      for (size_t i = 0; i < pool_.size(); ++i)
        if (pool_[i].tracks_grad()) {
          g_last_step = "final backward";
          fuzz::guarded("backward", [&] { backward_of(i); });
        }
    g_last_step.clear();
  }

 private:
  using Step = void (Program::*)();
  static const std::vector<std::pair<std::string, Step>>& steps();

  // ---- choices ---------------------------------------------------------------------------------
  size_t small_dim() {
    static constexpr size_t k[] = {0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 7, 8, 16, 33};
    return k[in_.below(std::size(k))];
  }
  size_t huge_dim() {
    static constexpr size_t k[] = {size_t(1) << 31, size_t(1) << 32,       (size_t(1) << 32) + 1,
                                   size_t(1) << 40, (size_t(1) << 61) + 1, size_t(1) << 62,
                                   size_t(1) << 63, SIZE_MAX / 2 + 1,      SIZE_MAX};
    return k[in_.below(std::size(k))];
  }
  bool absurd_now() { return !skip("absurd") && in_.one_in(32); }
  size_t dim_value() { return absurd_now() ? huge_dim() : small_dim(); }
  std::vector<size_t> random_dims() {
    std::vector<size_t> d(in_.below(5));
    for (auto& x : d) x = dim_value();
    tame(d);
    return d;
  }
  // "zero_huge" in TAPER_FUZZ_SKIP: no zero-element shape with an absurd dim.
  static void tame(std::vector<size_t>& d) {
    if (skip("zero_huge") && std::count(d.begin(), d.end(), 0) != 0)
      for (auto& x : d)
        if (x > kMaxElems) x = 2;
  }
  DType dtype() { return kDTypes[in_.below(std::size(kDTypes))]; }
  DType float_dtype() { return kDTypes[in_.below(4)]; }
  double special() {
    static const double k[] = {0.0,
                               1.0,
                               -1.0,
                               0.5,
                               2.0,
                               3.0,
                               -0.0,
                               1e-5,
                               1e-12,
                               1e30,
                               -1e30,
                               std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(),
                               std::numeric_limits<double>::quiet_NaN(),
                               std::numeric_limits<double>::denorm_min(),
                               std::numeric_limits<double>::max()};
    return k[in_.below(std::size(k))];
  }
  // A dim index, mostly valid for `rank` (negative ones too), now and then out of range.
  int64_t dim_index(size_t rank) {
    const auto r = static_cast<int64_t>(rank);
    if (in_.one_in(16)) return in_.coin() ? r + static_cast<int64_t>(in_.below(3)) : -r - 1;
    if (rank == 0) return in_.coin() ? 0 : -1;
    const int64_t d = static_cast<int64_t>(in_.below(rank));
    return in_.coin() ? d : d - r;
  }
  size_t pick() { return in_.below(pool_.size()); }
  Tensor& operand() { return pool_[pick()]; }

  // ---- bookkeeping -----------------------------------------------------------------------------
  void trace(const std::string& s) {
    g_last_step = s;
    if (kTrace) std::fprintf(stderr, "  %s\n", s.c_str());
  }

  // The promise about every result: a well-formed tensor.
  void check(const Tensor& t, const std::string& what) {
    TAPER_FUZZ_CHECK(t.defined(), what, ": returned an undefined tensor");
    if (skip("layout")) return;
    const auto n = product(t.dims());
    TAPER_FUZZ_CHECK(n.has_value(), what,
                     ": accepted a shape whose element count overflows: ", shape_str(t.dims()));
    TAPER_FUZZ_CHECK(*n == t.elem_count(), what, ": elem_count ", t.elem_count(), " of ",
                     shape_str(t.dims()));
    TAPER_FUZZ_CHECK(t.strides().size() == t.rank(), what, ": strides and dims differ in rank");
    if (*n == 0) return;
    // The farthest element, in elements from the start of the storage.
    __int128 hi = static_cast<__int128>(t.layout().offset), lo = hi;
    for (size_t i = 0; i < t.rank(); ++i) {
      const __int128 step = static_cast<__int128>(t.strides()[i]) * (t.dims()[i] - 1);
      (step > 0 ? hi : lo) += step;
    }
    const __int128 have = t.storage()->nbytes() / dtype_size(t.dtype());
    TAPER_FUZZ_CHECK(lo >= 0 && hi < have, what, ": the layout of ", shape_str(t.dims()),
                     " (offset ", t.layout().offset, ") reaches outside its storage of ",
                     t.storage()->nbytes(), " bytes");
  }

  void keep(const Tensor& t, const std::string& what) {
    check(t, what);
    trace(detail::str_cat("  -> t", pool_.size() < kMaxPool ? pool_.size() : next_slot_, " = ",
                          describe(t)));
    // A legal tensor too large to compute on (or one whose ops could make such a tensor).
    const auto r = reach(t.dims());
    if (t.elem_count() > kMaxElems || !r || *r > kMaxOut) return;
    if (pool_.size() < kMaxPool) {
      pool_.push_back(t);
    } else {
      pool_[next_slot_] = t;
      next_slot_ = (next_slot_ + 1) % kMaxPool;
    }
  }

  // Traces `what`, then runs it (so a crash's last trace line names the call) and keeps it.
  template <class F>
  void apply(const std::string& what, F&& f) {
    trace(what);
    keep(f(), what);
  }

  // Values for a new tensor of `dims` (which fit) in one of several patterns.
  Tensor fill(const std::vector<size_t>& dims, DType dt) {
    const Shape s(dims);
    switch (in_.below(6)) {
      case 0:
        return Tensor::zeros(s, dt);
      case 1:
        return Tensor::full(s, is_float(dt) || in_.one_in(4) ? special() : double(in_.below(8)),
                            dt);
      case 2:
        return Tensor::arange(0, double(*product(dims)), 1, dt).reshape(s);
      case 3:
        if (is_float(dt) && in_.one_in(4))
          return Tensor::rand(s, dt, Device::cpu(), in_.u8(), special(), special());
        if (is_float(dt)) return Tensor::rand(s, dt, Device::cpu(), in_.u8(), -2.0, 2.0);
        return Tensor::ones(s, dt);
      default:
        if (is_float(dt)) return Tensor::randn(s, dt, Device::cpu(), in_.u8());
        return Tensor::full(s, double(in_.below(4)), dt);
    }
  }

  // A new tensor; `dims` may be absurd (then it must be refused).
  std::optional<Tensor> create(const std::vector<size_t>& dims, DType dt, const char* how) {
    const auto n = product(dims);
    size_t bytes = 0;
    const bool absurd =
        !n || __builtin_mul_overflow(*n, dtype_size(dt), &bytes) || bytes >= kAbsurdBytes;
    if (!absurd && *n > kMaxElems) return std::nullopt;  // allocatable but too large for us
    const std::string what = detail::str_cat(how, "(", shape_str(dims), ", ", dtype_name(dt), ")");
    trace(what);
    Tensor t;
    if (absurd) {
      switch (in_.below(4)) {
        case 0:
          t = Tensor::zeros(Shape(dims), dt);
          break;
        case 1:
          t = Tensor::empty(Shape(dims), dt, Device::cpu());
          break;
        case 2:
          t = Tensor::full(Shape(dims), 1.0, dt);
          break;
        default:
          t = Tensor::randn(Shape(dims), is_float(dt) ? dt : DType::F32);
          break;
      }
    } else {
      t = fill(dims, dt);
    }
    check(t, what);
    TAPER_FUZZ_CHECK(t.dims() == dims, what, ": got shape ", shape_str(t.dims()));
    return t;
  }

  // A tensor of `dims` and `dt` for an op's other operand (nullopt when it would be too large).
  std::optional<Tensor> make(const std::vector<size_t>& dims, DType dt) {
    if (!fits(dims, kMaxElems)) return std::nullopt;
    return fill(dims, dt);
  }

  // Shapes related to `d`: the same, broadcastable to it, or anything.
  std::vector<size_t> related_dims(const std::vector<size_t>& d) {
    std::vector<size_t> out = d;
    switch (in_.below(6)) {
      case 0:
      case 1:
        break;
      case 2:
        out.erase(out.begin(), out.begin() + static_cast<ptrdiff_t>(in_.below(d.size() + 1)));
        break;
      case 3:
        for (auto& x : out)
          if (in_.coin()) x = 1;
        break;
      case 4:
        out.insert(out.begin(), small_dim());
        break;
      default:
        out = random_dims();
        break;
    }
    return out;
  }

  // A second operand for `a`: itself, another pool tensor, or a new one of a related shape
  // (mostly `a`'s dtype, now and then another, which must be refused).
  Tensor partner(const Tensor& a) {
    switch (in_.below(4)) {
      case 0:
        return a;
      case 1:
        return operand();
      default: {
        const DType dt = in_.one_in(16) ? dtype() : a.dtype();
        if (auto t = make(related_dims(a.dims()), dt)) return *t;
        return a;
      }
    }
  }

  // Indices in [0, n) of `count` elements (I64 or U32), now and then out of range or of a
  // dtype that must be refused.
  Tensor indices(const std::vector<size_t>& dims, size_t n) {
    const size_t count = product(dims).value_or(0);
    const bool bad = in_.one_in(16);
    const DType dt = in_.one_in(16) ? dtype() : (in_.coin() ? DType::I64 : DType::U32);
    std::vector<int64_t> v(std::min<size_t>(count, kMaxElems));
    for (auto& x : v) {
      if (bad && in_.one_in(4)) {
        static constexpr int64_t k[] = {-1, -100, INT64_MIN, INT64_MAX, 1 << 30};
        x = k[in_.below(std::size(k))];
      } else {
        x = static_cast<int64_t>(in_.below(n + (bad ? 2 : 0)));
      }
    }
    return Tensor::from_vector(v, Shape(dims)).to_dtype(dt);
  }

  void backward_of(size_t i) {
    const Tensor& t = pool_[i];
    trace(detail::str_cat("backward of t", i, " ", describe(t)));
    GradStore g;
    if (in_.coin() && t.elem_count() <= kMaxElems) {
      const Tensor seed = fill(t.dims(), t.dtype());
      g = t.backward(seed);
    } else {
      const Tensor loss = is_float(t.dtype()) ? t.sum_all() : t.to_dtype(DType::F32).sum_all();
      check(loss, "loss");
      g = loss.backward();
    }
    for (const Var& v : vars_) {
      const std::optional<Tensor> gv = g.get(v);
      if (!gv) continue;
      check(*gv, "a gradient");
      TAPER_FUZZ_CHECK(gv->dims() == v.dims() && gv->dtype() == v.dtype(), "gradient ",
                       describe(*gv), " of leaf ", describe(v));
      read(*gv);
    }
    grads_ = std::move(g);
  }

  // Touches every element (copy to the host), so stray layouts meet ASan.
  static void read(const Tensor& t) {
    if (t.elem_count() > kMaxElems) return;
    std::vector<uint8_t> buf(t.elem_count() * dtype_size(t.dtype()));
    t.copy_to_host(buf.data(), t.dtype());
  }

  // ---- steps -----------------------------------------------------------------------------------
  void step_new() {
    const DType dt = dtype();
    const auto t = create(random_dims(), dt, "Tensor::create");
    if (!t) return;
    if (is_float(dt) && vars_.size() < kMaxPool && in_.u8() % 3 != 0) {
      vars_.push_back(Var::from_tensor(*t));
      apply(detail::str_cat("Var(", describe(*t), ")"), [&] { return vars_.back(); });
    } else {
      apply(describe(*t), [&] { return *t; });
    }
  }
  // arange with odd bounds and steps: a count that is NaN, infinite or beyond any memory must
  // be refused; counts that a machine could hold but that are too large here are not asked for.
  void step_arange() {
    const double start = special(), end = special(), step = in_.coin() ? 1.0 : special();
    const DType dt = dtype();
    const double count = (end - start) / step;
    if (std::isfinite(count) && count > double(kMaxOut) &&
        count * double(dtype_size(dt)) < double(kAbsurdBytes))
      return;
    const std::string what =
        detail::str_cat("Tensor::arange(", start, ", ", end, ", ", step, ", ", dtype_name(dt), ")");
    trace(what);
    const Tensor t = Tensor::arange(start, end, step, dt);
    check(t, what);
    TAPER_FUZZ_CHECK(t.elem_count() <= kMaxOut, what, ": ", t.elem_count(), " elements");
    apply(what, [&] { return t; });
  }
  // from_host with a count that does not match the shape now and then (must be refused).
  void step_from_vector() {
    std::vector<size_t> dims = random_dims();
    if (!fits(dims, kMaxElems)) return;
    size_t n = *product(dims);
    if (in_.one_in(4)) n = in_.below(n + 3);
    std::vector<double> v(n);
    for (auto& x : v) x = in_.one_in(4) ? special() : double(in_.u8()) - 128;
    const DType dt = dtype();
    const std::string what = detail::str_cat("Tensor::from_vector(", n, " doubles, ",
                                             shape_str(dims), ").to_dtype(", dtype_name(dt), ")");
    trace(what);
    apply(what, [&] { return Tensor::from_vector(v, Shape(dims)).to_dtype(dt); });
  }
  void step_var_set() {
    if (vars_.empty()) return;
    Var& v = vars_[in_.below(vars_.size())];
    const auto t = make(in_.one_in(8) ? random_dims() : v.dims(), v.dtype());
    if (!t) return;
    trace(detail::str_cat("Var ", describe(v), ".set(", describe(*t), ")"));
    v.set(*t);
  }
  void step_narrow() {
    const Tensor a = operand();
    const int64_t d = dim_index(a.rank());
    size_t start = 0, len = 0;
    const size_t r = a.rank();
    const size_t n =
        r ? a.dims()[static_cast<size_t>((d % int64_t(r) + int64_t(r)) % int64_t(r))] : 0;
    if (absurd_now()) {
      start = in_.coin() ? huge_dim() : in_.below(n + 1);
      len = huge_dim();
    } else {
      start = in_.below(n + 2);
      len = in_.below(n + 2 - std::min(start, n + 1));
    }
    apply(detail::str_cat(describe(a), ".narrow(", d, ", ", start, ", ", len, ")"),
          [&] { return a.narrow(d, start, len); });
  }
  void step_transpose() {
    const Tensor a = operand();
    const int64_t d0 = dim_index(a.rank()), d1 = dim_index(a.rank());
    apply(detail::str_cat(describe(a), ".transpose(", d0, ", ", d1, ")"),
          [&] { return a.transpose(d0, d1); });
  }
  void step_permute() {
    const Tensor a = operand();
    std::vector<size_t> order(a.rank());
    std::iota(order.begin(), order.end(), 0);
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[in_.below(i)]);
    if (in_.one_in(8) && !order.empty())
      order[in_.below(order.size())] = in_.below(order.size() + 2);
    if (in_.one_in(16)) order.push_back(0);
    std::string o;
    for (size_t x : order) o += std::to_string(x) + " ";
    apply(detail::str_cat(describe(a), ".permute({", o, "})"), [&] { return a.permute(order); });
  }
  void step_reshape() {
    const Tensor a = operand();
    // A factorisation of the element count, or (now and then) any shape.
    std::vector<size_t> dims;
    if (in_.one_in(8)) {
      dims = random_dims();
    } else {
      size_t n = a.elem_count();
      const size_t parts = in_.below(4);
      for (size_t i = 0; i < parts && n > 1; ++i) {
        size_t f = 1 + in_.below(std::min<size_t>(n, 8));
        while (n % f) --f;
        dims.push_back(f);
        n /= f;
      }
      dims.push_back(n);
      if (in_.coin()) std::reverse(dims.begin(), dims.end());
      if (in_.one_in(4))
        dims.insert(dims.begin() + static_cast<ptrdiff_t>(in_.below(dims.size() + 1)), 1);
    }
    apply(detail::str_cat(describe(a), ".reshape(", shape_str(dims), ")"),
          [&] { return a.reshape(Shape(dims)); });
  }
  void step_broadcast_as() {
    const Tensor a = operand();
    std::vector<size_t> dims = a.dims();
    for (auto& x : dims)
      if (x == 1 && in_.coin()) x = dim_value();
    const size_t extra = in_.below(3);
    for (size_t i = 0; i < extra; ++i) dims.insert(dims.begin(), dim_value());
    if (in_.one_in(8)) dims = random_dims();
    tame(dims);
    apply(detail::str_cat(describe(a), ".broadcast_as(", shape_str(dims), ")"),
          [&] { return a.broadcast_as(Shape(dims)); });
  }
  void step_unsqueeze() {
    const Tensor a = operand();
    const int64_t d = dim_index(a.rank() + 1);
    apply(detail::str_cat(describe(a), ".unsqueeze(", d, ")"), [&] { return a.unsqueeze(d); });
  }
  void step_squeeze() {
    const Tensor a = operand();
    const int64_t d = dim_index(a.rank());
    apply(detail::str_cat(describe(a), ".squeeze(", d, ")"), [&] { return a.squeeze(d); });
  }
  void step_contiguous() {
    const Tensor a = operand();
    apply(describe(a) + ".contiguous()", [&] { return a.contiguous(); });
  }
  void step_to_dtype() {
    const Tensor a = operand();
    const DType dt = dtype();
    apply(detail::str_cat(describe(a), ".to_dtype(", dtype_name(dt), ")"),
          [&] { return a.to_dtype(dt); });
  }
  void step_detach() {
    const Tensor a = operand();
    apply(describe(a) + ".detach()", [&] { return a.detach(); });
  }
  void step_read() {
    const Tensor a = operand();
    trace(describe(a) + ".copy_to_host()");
    read(a);
    if (a.elem_count() == 1 || in_.one_in(8)) (void)a.item();
    if (is_float(a.dtype()) && a.elem_count() <= kMaxElems) (void)a.to_vector<double>();
  }

  void step_unary() {
    static const std::pair<const char*, Tensor (Tensor::*)() const> k[] = {
        {"neg", &Tensor::neg},           {"abs", &Tensor::abs},
        {"exp", &Tensor::exp},           {"log", &Tensor::log},
        {"sqrt", &Tensor::sqrt},         {"rsqrt", &Tensor::rsqrt},
        {"recip", &Tensor::recip},       {"sqr", &Tensor::sqr},
        {"tanh", &Tensor::tanh},         {"sigmoid", &Tensor::sigmoid},
        {"relu", &Tensor::relu},         {"gelu", &Tensor::gelu},
        {"gelu_erf", &Tensor::gelu_erf}, {"silu", &Tensor::silu},
        {"sin", &Tensor::sin},           {"cos", &Tensor::cos},
        {"sum_all", &Tensor::sum_all},   {"mean_all", &Tensor::mean_all}};
    const auto& entry = k[in_.below(std::size(k))];
    const char* name = entry.first;
    const auto fn = entry.second;
    if (skip(name)) return;
    const Tensor a = operand();
    apply(detail::str_cat(describe(a), ".", name, "()"), [&] { return (a.*fn)(); });
  }
  void step_unary_param() {
    const Tensor a = operand();
    const double p = special(), q = special();
    switch (in_.below(3)) {
      case 0:
        apply(detail::str_cat(describe(a), ".powf(", p, ")"), [&] { return a.powf(p); });
        break;
      case 1:
        apply(detail::str_cat(describe(a), ".affine(", p, ", ", q, ")"),
              [&] { return a.affine(p, q); });
        break;
      default:
        apply(detail::str_cat(describe(a), ".clamp(", p, ", ", q, ")"),
              [&] { return a.clamp(p, q); });
        break;
    }
  }
  void step_binary() {
    static const std::pair<const char*, Tensor (Tensor::*)(const Tensor&) const> k[] = {
        {"add", &Tensor::add}, {"sub", &Tensor::sub},         {"mul", &Tensor::mul},
        {"div", &Tensor::div}, {"maximum", &Tensor::maximum}, {"minimum", &Tensor::minimum},
        {"eq", &Tensor::eq},   {"ne", &Tensor::ne},           {"lt", &Tensor::lt},
        {"le", &Tensor::le},   {"gt", &Tensor::gt},           {"ge", &Tensor::ge}};
    const auto& entry = k[in_.below(std::size(k))];
    const char* name = entry.first;
    const auto fn = entry.second;
    if (skip(name)) return;
    const Tensor a = operand();
    const Tensor b = partner(a);
    if (!fits(broadcast_shapes(a.shape(), b.shape(), name).dims())) return;
    apply(detail::str_cat(describe(a), ".", name, "(", describe(b), ")"),
          [&] { return (a.*fn)(b); });
  }
  void step_scalar() {
    const Tensor a = operand();
    const double s = special();
    switch (in_.below(8)) {
      case 0:
        apply(detail::str_cat(describe(a), " + ", s), [&] { return a + s; });
        break;
      case 1:
        apply(detail::str_cat(describe(a), " - ", s), [&] { return a - s; });
        break;
      case 2:
        apply(detail::str_cat(describe(a), " * ", s), [&] { return a * s; });
        break;
      case 3:
        apply(detail::str_cat(describe(a), " / ", s), [&] { return a / s; });
        break;
      case 4:
        apply(detail::str_cat(s, " - ", describe(a)), [&] { return s - a; });
        break;
      case 5:
        apply(detail::str_cat(s, " / ", describe(a)), [&] { return s / a; });
        break;
      default:
        apply(detail::str_cat("-", describe(a)), [&] { return -a; });
        break;
    }
  }
  void step_where() {
    const Tensor a = operand();
    const Tensor b = partner(a);
    Tensor mask = in_.coin() ? a.gt(b) : partner(a);
    if (in_.coin()) {
      if (auto m = make(related_dims(a.dims()), in_.one_in(8) ? dtype() : DType::U8)) mask = *m;
    }
    const Shape s = broadcast_shapes(broadcast_shapes(mask.shape(), a.shape(), "where").dims(),
                                     b.shape(), "where");
    if (!fits(s.dims())) return;
    apply(detail::str_cat(describe(mask), ".where_cond(", describe(a), ", ", describe(b), ")"),
          [&] { return mask.where_cond(a, b); });
  }
  void step_mul_add() {
    const Tensor a = operand();
    const Tensor b = partner(a), c = partner(a);
    const Shape s = broadcast_shapes(broadcast_shapes(a.shape(), b.shape(), "mul_add").dims(),
                                     c.shape(), "mul_add");
    if (!fits(s.dims())) return;
    apply(detail::str_cat(describe(a), ".mul_add(", describe(b), ", ", describe(c), ")"),
          [&] { return a.mul_add(b, c); });
  }
  void step_reduce() {
    const Tensor a = operand();
    std::vector<int64_t> dims(in_.below(std::max<size_t>(a.rank(), 1) + 1));
    for (auto& d : dims) d = dim_index(a.rank());
    const bool keepdim = in_.coin();
    std::string ds;
    for (int64_t d : dims) ds += std::to_string(d) + " ";
    const std::string args = detail::str_cat("({", ds, "}, ", keepdim, ")");
    switch (in_.below(6)) {
      case 0:
        apply(describe(a) + ".sum" + args, [&] { return a.sum(dims, keepdim); });
        break;
      case 1:
        apply(describe(a) + ".mean" + args, [&] { return a.mean(dims, keepdim); });
        break;
      case 2:
        apply(describe(a) + ".max" + args, [&] { return a.max(dims, keepdim); });
        break;
      case 3:
        apply(describe(a) + ".min" + args, [&] { return a.min(dims, keepdim); });
        break;
      case 4: {
        const int64_t d = dim_index(a.rank());
        apply(detail::str_cat(describe(a), ".argmax(", d, ", ", keepdim, ")"),
              [&] { return a.argmax(d, keepdim); });
        break;
      }
      default: {
        const int64_t d = dim_index(a.rank());
        apply(detail::str_cat(describe(a), ".argmin(", d, ", ", keepdim, ")"),
              [&] { return a.argmin(d, keepdim); });
        break;
      }
    }
  }
  void step_matmul() {
    const Tensor a = operand();
    std::vector<size_t> bd;
    if (in_.one_in(8) || a.rank() == 0) {
      bd = random_dims();
    } else {
      // (..., k, n) with k = a's last dim, batch dims as a's, fewer, or broadcast ones.
      const size_t r = a.rank();
      bd.assign(a.dims().begin(), a.dims().end() - 1);
      if (!bd.empty()) bd.pop_back();
      if (in_.coin())
        bd.erase(bd.begin(), bd.begin() + static_cast<ptrdiff_t>(in_.below(bd.size() + 1)));
      for (auto& x : bd)
        if (in_.one_in(4)) x = 1;
      bd.push_back(a.dims()[r - 1]);
      bd.push_back(small_dim());
      if (r == 1 && in_.coin()) bd.erase(bd.begin(), bd.end() - 2);
    }
    const auto b = make(bd, in_.one_in(16) ? dtype() : a.dtype());
    if (!b) return;
    // Work and output bounds from the shapes alone (an Error for mismatched ones comes below).
    if (a.rank() >= 1 && b->rank() >= 1) {
      const size_t m = a.rank() >= 2 ? a.dims()[a.rank() - 2] : 1;
      const size_t k = a.dims().back(), n = b->rank() >= 2 ? b->dims().back() : 1;
      const size_t batch = std::max(a.elem_count() / std::max<size_t>(m * k, 1),
                                    b->elem_count() / std::max<size_t>(k * n, 1));
      const auto work = product({batch, m, n, std::max<size_t>(k, 1)});
      if (!work || *work > kMaxMatmulWork || !fits({batch, m, n})) return;
    }
    apply(detail::str_cat(describe(a), ".matmul(", describe(*b), ")"),
          [&] { return a.matmul(*b); });
  }
  void step_index_select() {
    const Tensor a = operand();
    const int64_t d = dim_index(a.rank());
    const size_t r = a.rank();
    const size_t n =
        r ? a.dims()[static_cast<size_t>((d % int64_t(r) + int64_t(r)) % int64_t(r))] : 1;
    const size_t count = in_.below(9);
    std::vector<size_t> id{count};
    if (in_.one_in(16)) id = random_dims();
    if (!fits(id, 64)) return;
    const Tensor idx = indices(id, n);
    if (!fits({a.elem_count() / std::max<size_t>(n, 1), std::max<size_t>(count, 1)})) return;
    apply(detail::str_cat(describe(a), ".index_select(", describe(idx), ", ", d, ")"),
          [&] { return a.index_select(idx, d); });
  }
  /// gather's and scatter_add's index operand along d of `a`: a's dims with a short extent
  /// along d (now and then dims related to a's), values into a's extent there; none when it
  /// would be too large.
  std::optional<Tensor> index_along(const Tensor& a, int64_t d) {
    const size_t r = a.rank();
    const size_t dn = r ? static_cast<size_t>((d % int64_t(r) + int64_t(r)) % int64_t(r)) : 0;
    std::vector<size_t> id = a.dims();
    if (r) id[dn] = small_dim();
    if (in_.one_in(8)) id = related_dims(a.dims());
    if (!fits(id, kMaxElems)) return std::nullopt;
    return indices(id, r ? a.dims()[dn] : 1);
  }
  void step_gather() {
    const Tensor a = operand();
    const int64_t d = dim_index(a.rank());
    const std::optional<Tensor> ix = index_along(a, d);
    if (!ix) return;
    const Tensor idx = *ix;
    apply(detail::str_cat(describe(a), ".gather(", describe(idx), ", ", d, ")"),
          [&] { return a.gather(idx, d); });
  }
  void step_scatter_add() {
    const Tensor a = operand();
    const int64_t d = dim_index(a.rank());
    const std::optional<Tensor> ix = index_along(a, d);
    if (!ix) return;
    const Tensor idx = *ix;
    const std::vector<size_t> id = idx.dims();
    const auto src =
        make(in_.one_in(8) ? related_dims(id) : id, in_.one_in(16) ? dtype() : a.dtype());
    if (!src) return;
    apply(detail::str_cat(describe(a), ".scatter_add(", describe(idx), ", ", describe(*src), ", ",
                          d, ")"),
          [&] { return a.scatter_add(idx, *src, d); });
  }
  void step_cat() {
    const Tensor a = operand();
    const int64_t d = dim_index(a.rank());
    const size_t r = a.rank();
    const size_t dn = r ? static_cast<size_t>((d % int64_t(r) + int64_t(r)) % int64_t(r)) : 0;
    std::vector<Tensor> ts{a};
    const size_t more = in_.below(4);
    const bool stack = in_.one_in(3);
    for (size_t i = 0; i < more; ++i) {
      std::vector<size_t> od = a.dims();
      if (r && !stack && in_.coin()) od[dn] = small_dim();
      if (in_.one_in(8)) od = related_dims(a.dims());
      if (in_.one_in(4)) {
        ts.push_back(operand());
      } else if (auto t = make(od, in_.one_in(16) ? dtype() : a.dtype())) {
        ts.push_back(*t);
      }
    }
    size_t total = 0;
    for (const Tensor& t : ts) total += t.elem_count();
    if (total > kMaxOut) return;
    std::string args;
    for (const Tensor& t : ts) args += describe(t) + ", ";
    if (stack)
      apply(detail::str_cat("Tensor::stack({", args, "}, ", d, ")"),
            [&] { return Tensor::stack(ts, d); });
    else
      apply(detail::str_cat("Tensor::cat({", args, "}, ", d, ")"),
            [&] { return Tensor::cat(ts, d); });
  }

  // A weight of the last dim's size (or C for group norm): (D), empty, undefined or wrong.
  Tensor weight(size_t d, DType dt) {
    switch (in_.below(8)) {
      case 0:
        return Tensor();
      case 1:
        return Tensor::zeros({0}, dt);
      case 2:
        return make(random_dims(), in_.one_in(4) ? dtype() : dt).value_or(Tensor());
      case 3: {  // a trainable weight
        if (auto t = make({d}, dt)) {
          if (!is_float(dt) || vars_.size() >= kMaxPool) return *t;
          vars_.push_back(Var::from_tensor(*t));
          return vars_.back();
        }
        return Tensor();
      }
      default:
        return make({d}, dt).value_or(Tensor());
    }
  }
  static std::string wdesc(const Tensor& w) { return w.defined() ? describe(w) : "Tensor()"; }

  // Whether to call the composed form of `op` ("composed_<op>" in TAPER_FUZZ_SKIP: never).
  bool use_composed(const char* op) { return in_.coin() && !skip(std::string("composed_") + op); }

  void step_softmax() {
    const Tensor a = operand();
    const bool composed = use_composed("softmax");
    if (in_.coin())
      apply(detail::str_cat(composed ? "composed" : "ops", "::softmax_last_dim(", describe(a), ")"),
            [&] { return composed ? composed::softmax_last_dim(a) : ops::softmax_last_dim(a); });
    else
      apply(detail::str_cat(composed ? "composed" : "ops", "::log_softmax_last_dim(", describe(a),
                            ")"),
            [&] {
              return composed ? composed::log_softmax_last_dim(a) : ops::log_softmax_last_dim(a);
            });
  }
  void step_rms_norm() {
    const Tensor a = operand();
    const Tensor w = weight(a.rank() ? a.dims().back() : 1, a.dtype());
    const double eps = in_.coin() ? 1e-6 : special();
    const bool composed = use_composed("rms_norm");
    apply(detail::str_cat(composed ? "composed" : "ops", "::rms_norm(", describe(a), ", ", wdesc(w),
                          ", ", eps, ")"),
          [&] { return composed ? composed::rms_norm(a, w, eps) : ops::rms_norm(a, w, eps); });
  }
  void step_layer_norm() {
    const Tensor a = operand();
    const size_t d = a.rank() ? a.dims().back() : 1;
    const Tensor w = weight(d, a.dtype()), b = weight(d, a.dtype());
    const double eps = in_.coin() ? 1e-5 : special();
    const bool composed = use_composed("layer_norm");
    apply(detail::str_cat(composed ? "composed" : "ops", "::layer_norm(", describe(a), ", ",
                          wdesc(w), ", ", wdesc(b), ", ", eps, ")"),
          [&] {
            return composed ? composed::layer_norm(a, w, b, eps) : ops::layer_norm(a, w, b, eps);
          });
  }
  void step_group_norm() {
    const Tensor a = operand();
    const size_t c = a.rank() >= 2 ? a.dims()[1] : 1;
    // Beyond int64 ("huge_groups" in TAPER_FUZZ_SKIP: never). Not 2^32: on an empty (N, 0)
    // input that is a legal (N, 2^32) pair of statistics, too large to allocate here.
    static constexpr size_t kHuge[] = {SIZE_MAX, size_t(1) << 63, (size_t(1) << 63) + 3};
    size_t g;
    switch (in_.below(5)) {
      case 0:
        g = 1;
        break;
      case 1:
        g = c;
        break;
      case 2:
        g = in_.below(c + 2);
        break;
      case 3:
        g = in_.one_in(4) && !skip("huge_groups") ? kHuge[in_.below(3)] : 2;
        break;
      default: {
        g = 1 + in_.below(std::max<size_t>(c, 1));
        while (c % g) --g;
        break;
      }
    }
    const Tensor w = weight(c, a.dtype()), b = weight(c, a.dtype());
    const double eps = in_.coin() ? 1e-5 : special();
    const bool composed = use_composed("group_norm");
    apply(detail::str_cat(composed ? "composed" : "ops", "::group_norm(", describe(a), ", ", g,
                          ", ", wdesc(w), ", ", wdesc(b), ", ", eps, ")"),
          [&] {
            return composed ? composed::group_norm(a, g, w, b, eps)
                            : ops::group_norm(a, g, w, b, eps);
          });
  }
  void step_loss() {
    const Tensor a = operand();
    std::vector<size_t> td = a.dims();
    const size_t c = td.empty() ? 1 : td.back();
    if (!td.empty()) td.pop_back();
    if (in_.one_in(8)) td = related_dims(td);
    if (!fits(td, kMaxElems)) return;
    const nn::Reduction red =
        std::array{nn::Reduction::None, nn::Reduction::Mean, nn::Reduction::Sum}[in_.below(3)];
    const int64_t ignore = in_.coin() ? -100 : static_cast<int64_t>(in_.below(c + 1));
    switch (in_.below(3)) {
      case 0: {
        const Tensor t = indices(td, c);
        const double smooth = in_.coin() ? 0.0 : special();
        apply(
            detail::str_cat("nn::cross_entropy(", describe(a), ", ", describe(t), ", ignore ",
                            ignore, ", smoothing ", smooth, ")"),
            [&] {
              return nn::cross_entropy(
                  a, t,
                  nn::CrossEntropyOptions().ignore_index(ignore).label_smoothing(smooth).reduction(
                      red));
            });
        break;
      }
      case 1: {
        const Tensor t = indices(td, c);
        apply(detail::str_cat("nn::nll_loss(", describe(a), ", ", describe(t), ", ignore ", ignore,
                              ")"),
              [&] {
                return nn::nll_loss(a, t, nn::NllLossOptions().ignore_index(ignore).reduction(red));
              });
        break;
      }
      default: {
        const Tensor b = partner(a);
        apply(detail::str_cat("nn::mse_loss(", describe(a), ", ", describe(b), ")"),
              [&] { return nn::mse_loss(a, b, red); });
        break;
      }
    }
  }
  void step_nn() {
    namespace F = nn::functional;
    const Tensor a = operand();
    switch (in_.below(4)) {
      case 0: {  // linear: x (..., in), w (out, in), b (out)
        const size_t in = a.rank() ? a.dims().back() : 1, out = small_dim();
        const Tensor w = weight(out * in, a.dtype());
        const Tensor wm = w.defined() && w.elem_count() == out * in ? w.reshape({out, in}) : w;
        const Tensor b = weight(out, a.dtype());
        if (!fits({a.elem_count() / std::max<size_t>(in, 1), out}) ||
            a.elem_count() * std::max<size_t>(out, 1) > kMaxMatmulWork)
          return;
        apply(detail::str_cat("F::linear(", describe(a), ", ", wdesc(wm), ", ", wdesc(b), ")"),
              [&] { return F::linear(a, wm, b); });
        break;
      }
      case 1: {  // embedding: ids (...), w (V, E)
        const size_t v = 1 + in_.below(8), e = small_dim();
        const Tensor ids = indices(related_dims(a.dims()), v);
        const auto w = make({v, e}, in_.coin() ? a.dtype() : float_dtype());
        if (!w || !fits({ids.elem_count(), e})) return;
        apply(detail::str_cat("F::embedding(", describe(ids), ", ", describe(*w), ")"),
              [&] { return F::embedding(ids, *w); });
        break;
      }
      case 2: {
        const double p = in_.coin() ? 0.5 : special();
        const bool training = in_.coin();
        apply(detail::str_cat("F::dropout(", describe(a), ", ", p, ", ", training, ")"),
              [&] { return F::dropout(a, p, in_.u8(), training); });
        break;
      }
      default: {  // attention: q (B, H, T, D), k, v (B, H, S, D)
        if (a.rank() != 4) return;
        const auto& d = a.dims();
        std::vector<size_t> kd = d;
        kd[2] = small_dim();
        if (in_.one_in(8)) kd = related_dims(d);
        const auto k = make(kd, a.dtype());
        const auto v = make(kd, a.dtype());
        if (!k || !v || !fits({d[0], d[1], d[2], kd.size() == 4 ? kd[2] : 1})) return;
        if (product({d[0], d[1], d[2], kd.size() == 4 ? kd[2] : 1, d[3]}).value_or(SIZE_MAX) >
            kMaxMatmulWork)
          return;
        const bool causal = in_.coin();
        apply(detail::str_cat("F::scaled_dot_product_attention(", describe(a), ", ", describe(*k),
                              ", ", describe(*v), ", causal ", causal, ")"),
              [&] { return F::scaled_dot_product_attention(a, *k, *v, Tensor(), causal); });
        break;
      }
    }
  }
  // An optimizer step (SGD or AdamW, fused or not, odd hyper-parameters) over the leaves, with
  // the gradients of the last backward pass.
  void step_optim() {
    if (vars_.empty()) return;
    std::vector<Var> params;
    for (const Var& v : vars_)
      if (in_.u8() % 4) params.push_back(v);
    const double lr = in_.coin() ? 1e-2 : special();
    const bool adamw = in_.coin(), fused = in_.coin();
    trace(detail::str_cat(adamw ? "AdamW" : "SGD", "(", params.size(), " params, lr ", lr,
                          fused ? ", fused" : "", ").step(last grads)"));
    std::unique_ptr<nn::Optimizer> opt;
    if (adamw) {
      opt = std::make_unique<nn::AdamW>(params, nn::AdamWOptions(lr)
                                                    .weight_decay(in_.coin() ? 0.01 : special())
                                                    .eps(in_.coin() ? 1e-8 : special())
                                                    .fused(fused));
    } else {
      opt = std::make_unique<nn::SGD>(params, nn::SGDOptions(lr)
                                                  .momentum(in_.coin() ? 0.9 : special())
                                                  .weight_decay(in_.coin() ? 0.0 : special())
                                                  .nesterov(in_.coin()));
    }
    for (size_t i = 0, n = 1 + in_.below(3); i < n; ++i) opt->step(grads_);
    for (const Var& v : params) check(v, "a parameter after a step");
  }
  void step_backward() {
    if (pool_.empty()) return;
    const size_t i = pick();
    if (!pool_[i].tracks_grad()) return;
    backward_of(i);
  }

  fuzz::Choices& in_;
  std::vector<Tensor> pool_;
  std::vector<Var> vars_;
  GradStore grads_;  // of the last backward pass
  size_t next_slot_ = 0;
};

const std::vector<std::pair<std::string, Program::Step>>& Program::steps() {
  static const std::vector<std::pair<std::string, Step>> k = {
      {"new", &Program::step_new},
      {"arange", &Program::step_arange},
      {"from_vector", &Program::step_from_vector},
      {"var_set", &Program::step_var_set},
      {"narrow", &Program::step_narrow},
      {"transpose", &Program::step_transpose},
      {"permute", &Program::step_permute},
      {"reshape", &Program::step_reshape},
      {"broadcast_as", &Program::step_broadcast_as},
      {"unsqueeze", &Program::step_unsqueeze},
      {"squeeze", &Program::step_squeeze},
      {"contiguous", &Program::step_contiguous},
      {"to_dtype", &Program::step_to_dtype},
      {"detach", &Program::step_detach},
      {"read", &Program::step_read},
      {"unary", &Program::step_unary},
      {"unary", &Program::step_unary},
      {"unary_param", &Program::step_unary_param},
      {"binary", &Program::step_binary},
      {"binary", &Program::step_binary},
      {"scalar", &Program::step_scalar},
      {"where", &Program::step_where},
      {"mul_add", &Program::step_mul_add},
      {"reduce", &Program::step_reduce},
      {"reduce", &Program::step_reduce},
      {"matmul", &Program::step_matmul},
      {"index_select", &Program::step_index_select},
      {"gather", &Program::step_gather},
      {"scatter_add", &Program::step_scatter_add},
      {"cat", &Program::step_cat},
      {"softmax", &Program::step_softmax},
      {"rms_norm", &Program::step_rms_norm},
      {"layer_norm", &Program::step_layer_norm},
      {"group_norm", &Program::step_group_norm},
      {"loss", &Program::step_loss},
      {"nn", &Program::step_nn},
      {"backward", &Program::step_backward},
      {"backward", &Program::step_backward},
      {"optim", &Program::step_optim},
  };
  return k;
}

}  // namespace

// An allocation larger than ASan can make returns null instead of ending the process, as
// aligned_alloc does without ASan: taper must then raise its out-of-memory Error. (operator new
// still reports, as a std::bad_alloc would escape.)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // One thread: a reproducer replays exactly; ASan sees every cached block freed for real.
  setenv("TAPER_NUM_THREADS", "1", 0);
  setenv("TAPER_NO_ALLOC_CACHE", "1", 0);
  __sanitizer_set_death_callback(on_death);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Choices in(data, size);
  Program p(in);
  try {
    p.run();
  } catch (const std::exception& e) {
    fuzz::finding(std::string("an exception escaped: ") + e.what());
  }
  return 0;
}
