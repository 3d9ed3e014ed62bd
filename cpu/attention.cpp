// attention.cpp: Highway kernels of the fused attention op and its dedicated backward op
// (attention, attention_bwd), for bf16, f16, f32 and f64.
//
// What it is: one task per (batch, head), threaded over the B * H heads with a fixed split (a
// head's work is the same sequence of operations whichever thread runs it, so results do not
// depend on the thread count, and no two tasks write the same output: no atomics). A task copies
// its head's K (transposed) and V into compute-type scratch, then walks the query rows: the
// scores of one row live in a scratch row of S elements, never a (T, S) block, and nothing of
// size (B, H, T, S) is allocated by either kernel. The backward takes the query rows in blocks
// of kBlock (16): their P and dS rows (16 x S scratch) update each dk, dv row once per block.
// The products run with four vectors of the result in registers (RowTimesRows, AccumRows).
// What it is not: autograd (core/src/backward.cpp calls attention_bwd), the composed forms
// (metal_fallback/composed.cpp) or a tiled flash kernel with GEMM micro-kernels (each head's K,
// V are copied once, then read per query row). The scalar reference is tests/ref/fused_ref.h.
//
// Shapes: q (B, H, T, D), k and v (B, H, S, D), any strides; mask additive, broadcastable to
// (B, H, T, S) (read through strides, 0 along broadcast dims) or absent; out (B, H, T, D) and
// lse (B, H, T), lse = max + log(sum exp(score - max)) per query row in the compute type; the
// backward adds dout (B, H, T, D) and returns dq, dk, dv in q's dtype. out, dq, dk and dv are
// stored token major: (B, T or S, H, D) buffers returned as (B, H, T or S, D) views, so that
// merging the heads back, (B, T, H D), is a view and not a copy (as the model does); lse is
// contiguous.
// Precision: bf16/f16 load to f32, everything is f32 (the exp is ExpNoSubnormal of
// simd_exp-inl.h, within 2 ulp), and each output is rounded once at the store; f64 is f64
// throughout. Forward: out = (sum_s e_s v_s) / sum_s e_s, e_s = exp(score_s - max).
// Backward: P = exp(score - lse), D = sum(dout * out), dS = P (dout . v_s - D),
// dq = scale sum_s dS_s k_s, dk_s = scale sum_t dS_ts q_t, dv_s = sum_t P_ts dout_t, the sums
// over t in row order.
// Special values, as softmax: a row whose scores are all -inf, hold a NaN or +inf gives NaN
// (exp of -inf - -inf, NaN or inf - inf), its lse is NaN, and the backward's P row is NaN too.
// S = 0 gives out = 0 (an empty sum, as the composed matmul) and lse = -inf.

#ifndef TAPER_CPU_ATTENTION_SHARED_
#define TAPER_CPU_ATTENTION_SHARED_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/cpu_common.h"
#include "taper/dtype.h"
#include "taper/op.h"

namespace taper::cpu::attention_detail {

/// One attention job; pointers are element 0 of each view, strides in elements over (B, H, *, *).
struct Job {
  DType dt = DType::F32;
  double scale = 1.0;
  size_t B = 0, H = 0, T = 0, S = 0, D = 0;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* mask = nullptr;  ///< null: no mask
  const void* dout = nullptr;  ///< backward
  const void* o = nullptr;     ///< backward: the forward output (any strides)
  int64_t qs[4] = {}, ks[4] = {}, vs[4] = {}, ms[4] = {}, dos[4] = {}, os[4] = {};
  void* out = nullptr;         ///< forward: out; backward: dq (token major: TokRow)
  void* lse = nullptr;         ///< forward writes, backward reads (contiguous, compute type)
  void* dk = nullptr;          ///< backward (token major)
  void* dv = nullptr;          ///< backward (token major)
};

}  // namespace taper::cpu::attention_detail

#endif  // TAPER_CPU_ATTENTION_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "cpu/simd_exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace taper::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace ad = taper::cpu::attention_detail;

/// n rounded up to whole vectors of C: scratch rows are padded so every vector loop is whole.
template <class C> HWY_INLINE size_t Padded(size_t n) {
  const hn::ScalableTag<C> d;
  const size_t N = hn::Lanes(d);
  return (n + N - 1) / N * N;
}

/// One vector of sum_{k < K} c[k * cs] * X[k * ld + (0, N)], in four partial sums (k mod 4,
/// added as (s0 + s1) + (s2 + s3)): a short row (D = 32 is two f32 vectors on AVX-512) would
/// otherwise wait on one multiply-add's latency per k. A fixed order: the same bits every run.
template <class DC, class C>
HWY_INLINE hn::Vec<DC> ColumnSum(DC d, const C* HWY_RESTRICT c, size_t cs, size_t K,
                                 const C* HWY_RESTRICT X, size_t ld) {
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t k = 0;
  for (; k + 4 <= K; k += 4) {
    s0 = hn::MulAdd(hn::Set(d, c[k * cs]), hn::LoadU(d, X + k * ld), s0);
    s1 = hn::MulAdd(hn::Set(d, c[(k + 1) * cs]), hn::LoadU(d, X + (k + 1) * ld), s1);
    s2 = hn::MulAdd(hn::Set(d, c[(k + 2) * cs]), hn::LoadU(d, X + (k + 2) * ld), s2);
    s3 = hn::MulAdd(hn::Set(d, c[(k + 3) * cs]), hn::LoadU(d, X + (k + 3) * ld), s3);
  }
  for (; k < K; ++k) s0 = hn::MulAdd(hn::Set(d, c[k * cs]), hn::LoadU(d, X + k * ld), s0);
  return hn::Add(hn::Add(s0, s1), hn::Add(s2, s3));
}

/// y[0, n) (+)= sum_{b < nb} c[b * cs] * X[b * ld + (0, n)], the sum in b order, n padded: four
/// vectors of y stay in registers across the nb rows (one load per multiply-add, where an Axpy
/// per row would also load and store y); vectors past the last block of four: ColumnSum. With
/// kAdd the sum goes onto y's value, else y is overwritten (the same bits as Axpy calls on a
/// zeroed y).
template <bool kAdd, class C>
HWY_INLINE void AccumRows(const C* HWY_RESTRICT c, size_t cs, size_t nb, const C* HWY_RESTRICT X,
                          size_t ld, C* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<C> d;
  const size_t N = hn::Lanes(d);
  auto start = [&](size_t at) { return kAdd ? hn::LoadU(d, y + at) : hn::Zero(d); };
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    auto s0 = start(i), s1 = start(i + N), s2 = start(i + 2 * N), s3 = start(i + 3 * N);
    for (size_t b = 0; b < nb; ++b) {
      const auto x = hn::Set(d, c[b * cs]);
      const C* r = X + b * ld + i;
      s0 = hn::MulAdd(x, hn::LoadU(d, r), s0);
      s1 = hn::MulAdd(x, hn::LoadU(d, r + N), s1);
      s2 = hn::MulAdd(x, hn::LoadU(d, r + 2 * N), s2);
      s3 = hn::MulAdd(x, hn::LoadU(d, r + 3 * N), s3);
    }
    hn::StoreU(s0, d, y + i);
    hn::StoreU(s1, d, y + i + N);
    hn::StoreU(s2, d, y + i + 2 * N);
    hn::StoreU(s3, d, y + i + 3 * N);
  }
  for (; i < n; i += N) {
    const auto t = ColumnSum(d, c, cs, nb, X + i, ld);
    hn::StoreU(kAdd ? hn::Add(hn::LoadU(d, y + i), t) : t, d, y + i);
  }
}

/// out[0, n) = sum_{k < K} a[k] * M[k * ld + (0, n)] (AccumRows onto nothing).
template <class C>
HWY_INLINE void RowTimesRows(const C* HWY_RESTRICT a, size_t K, const C* HWY_RESTRICT M,
                             size_t ld, C* HWY_RESTRICT out, size_t n) {
  AccumRows<false>(a, 1, K, M, ld, out, n);
}

/// e[0, n) = exp(s[0, n) - c), n padded; padding lanes of s hold -inf (exp: 0).
template <class C> HWY_INLINE void ExpShifted(const C* s, C c, C* e,  // may be in place
                                              size_t n) {
  const hn::ScalableTag<C> d;
  const size_t N = hn::Lanes(d);
  const auto vc = hn::Set(d, c);
  for (size_t i = 0; i < n; i += N)
    hn::StoreU(ExpNoSubnormal(d, hn::Sub(hn::LoadU(d, s + i), vc)), d, e + i);
}

template <class T, class C = compute_t<T>>
HWY_INLINE void LoadRow(const T* p, int64_t stride, size_t n, size_t padded, C* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = widen(p[static_cast<int64_t>(i) * stride]);
  for (size_t i = n; i < padded; ++i) dst[i] = C(0);
}

/// The head's K transposed (D rows of Sp) and, as rows (S rows of Dp), K or V.
template <class T>
HWY_INLINE void LoadHead(const T* base, const int64_t* st, size_t S, size_t D, size_t Sp,
                         size_t Dp, compute_t<T>* transposed, compute_t<T>* rows) {
  using C = compute_t<T>;
  if (transposed != nullptr) {
    for (size_t d = 0; d < D; ++d) {
      C* r = transposed + d * Sp;
      for (size_t s = 0; s < S; ++s)
        r[s] = widen(base[static_cast<int64_t>(s) * st[2] + static_cast<int64_t>(d) * st[3]]);
      for (size_t s = S; s < Sp; ++s) r[s] = C(0);
    }
  }
  if (rows != nullptr)
    for (size_t s = 0; s < S; ++s)
      LoadRow(base + static_cast<int64_t>(s) * st[2], st[3], D, Dp, rows + s * Dp);
}

/// The scores of query row q (padded to Dp): sc[s] = scale * (q . k_s) + mask[s] for s < S,
/// -inf in the padding. kt: K transposed (D rows of Sp).
template <class T, class C = compute_t<T>>
HWY_INLINE void Scores(const ad::Job& j, const C* q, const C* kt, const T* mrow, size_t Sp,
                       C* sc) {
  RowTimesRows(q, j.D, kt, Sp, sc, Sp);
  const C scale = static_cast<C>(j.scale);
  for (size_t s = 0; s < j.S; ++s) {
    C x = scale * sc[s];
    if (mrow != nullptr) x += widen(mrow[static_cast<int64_t>(s) * j.ms[3]]);
    sc[s] = x;
  }
  for (size_t s = j.S; s < Sp; ++s) sc[s] = -std::numeric_limits<C>::infinity();
}

template <class T> const T* At(const void* p, const int64_t* st, size_t b, size_t h, size_t t) {
  return static_cast<const T*>(p) + static_cast<int64_t>(b) * st[0] +
         static_cast<int64_t>(h) * st[1] + static_cast<int64_t>(t) * st[2];
}

/// Offset of row r (of n: T or S) of head (b, h) in a token-major output, (B, n, H, D).
inline size_t TokRow(const ad::Job& j, size_t b, size_t h, size_t r, size_t n) {
  return ((b * n + r) * j.H + h) * j.D;
}

template <class T> void FwdHeads(const ad::Job& j, size_t begin, size_t end) {
  using C = compute_t<T>;
  const size_t S = j.S, D = j.D, Sp = Padded<C>(S), Dp = Padded<C>(D);
  C* kt = thread_scratch<C, 0>(D * Sp);
  C* vr = thread_scratch<C, 1>(S * Dp);
  C* q = thread_scratch<C, 2>(Dp);
  C* sc = thread_scratch<C, 3>(Sp);
  C* acc = thread_scratch<C, 4>(Dp);
  T* out = static_cast<T*>(j.out);
  C* lse = static_cast<C*>(j.lse);
  for (size_t bh = begin; bh < end; ++bh) {
    const size_t b = bh / j.H, h = bh % j.H;
    LoadHead<T>(At<T>(j.k, j.ks, b, h, 0), j.ks, S, D, Sp, Dp, kt, nullptr);
    LoadHead<T>(At<T>(j.v, j.vs, b, h, 0), j.vs, S, D, Sp, Dp, nullptr, vr);
    for (size_t t = 0; t < j.T; ++t) {
      T* orow = out + TokRow(j, b, h, t, j.T);
      if (S == 0) {  // an empty sum: 0, as the composed matmul gives
        std::fill(orow, orow + D, round_to<T>(C(0)));
        lse[bh * j.T + t] = -std::numeric_limits<C>::infinity();
        continue;
      }
      LoadRow(At<T>(j.q, j.qs, b, h, t), j.qs[3], D, Dp, q);
      const T* mrow = j.mask ? At<T>(j.mask, j.ms, b, h, t) : nullptr;
      Scores<T>(j, q, kt, mrow, Sp, sc);
      C m = -std::numeric_limits<C>::infinity();
      for (size_t s = 0; s < S; ++s) m = sc[s] > m ? sc[s] : m;  // NaN scores: found by the sum
      ExpShifted(sc, m, sc, Sp);  // all -inf (m = -inf): NaN everywhere, as softmax
      C sum = 0;
      for (size_t s = 0; s < S; ++s) sum += sc[s];
      RowTimesRows(sc, S, vr, Dp, acc, Dp);
      for (size_t d = 0; d < D; ++d) orow[d] = round_to<T>(acc[d] / sum);
      lse[bh * j.T + t] = m + std::log(sum);
    }
  }
}

/// Query rows per backward block: their P and dS rows (kBlock x S scratch) feed dk and dv with
/// one read-modify-write of each dk, dv row per block instead of per query row.
inline constexpr size_t kBlock = 16;

template <class T> void BwdHeads(const ad::Job& j, size_t begin, size_t end) {
  using C = compute_t<T>;
  const size_t S = j.S, D = j.D, Sp = Padded<C>(S), Dp = Padded<C>(D);
  C* kt = thread_scratch<C, 0>(D * Sp);
  C* kr = thread_scratch<C, 1>(S * Dp);
  C* vt = thread_scratch<C, 5>(D * Sp);
  C* dka = thread_scratch<C, 6>(S * Dp);
  C* dva = thread_scratch<C, 7>(S * Dp);
  C* qb = thread_scratch<C, 2>(kBlock * Dp);   // the block's q rows
  C* gb = thread_scratch<C, 8>(kBlock * Dp);   // the block's dout rows
  C* pb = thread_scratch<C, 3>(kBlock * Sp);   // the block's P rows
  C* sb = thread_scratch<C, 9>(kBlock * Sp);   // dP, then dS rows
  C* dq = thread_scratch<C, 4>(Dp);
  const C scale = static_cast<C>(j.scale);
  T* dqo = static_cast<T*>(j.out);
  T* dko = static_cast<T*>(j.dk);
  T* dvo = static_cast<T*>(j.dv);
  const C* lse = static_cast<const C*>(j.lse);
  for (size_t bh = begin; bh < end; ++bh) {
    const size_t b = bh / j.H, h = bh % j.H;
    if (S == 0) {  // no keys: dq is an empty sum; dk, dv are empty
      for (size_t t = 0; t < j.T; ++t) {
        T* dqrow = dqo + TokRow(j, b, h, t, j.T);
        std::fill(dqrow, dqrow + D, round_to<T>(C(0)));
      }
      continue;
    }
    LoadHead<T>(At<T>(j.k, j.ks, b, h, 0), j.ks, S, D, Sp, Dp, kt, kr);
    LoadHead<T>(At<T>(j.v, j.vs, b, h, 0), j.vs, S, D, Sp, Dp, vt, nullptr);
    std::fill(dka, dka + S * Dp, C(0));
    std::fill(dva, dva + S * Dp, C(0));
    for (size_t t0 = 0; t0 < j.T; t0 += kBlock) {
      const size_t nb = std::min(kBlock, j.T - t0);
      for (size_t r = 0; r < nb; ++r) {
        const size_t t = t0 + r;
        C* q = qb + r * Dp;
        C* go = gb + r * Dp;
        C* p = pb + r * Sp;
        C* ds = sb + r * Sp;
        LoadRow(At<T>(j.q, j.qs, b, h, t), j.qs[3], D, Dp, q);
        LoadRow(At<T>(j.dout, j.dos, b, h, t), j.dos[3], D, Dp, go);
        const T* orow = At<T>(j.o, j.os, b, h, t);
        C rowdot = 0;  // D = sum(dout * out), in order
        for (size_t d = 0; d < D; ++d)
          rowdot += go[d] * widen(orow[static_cast<int64_t>(d) * j.os[3]]);
        const T* mrow = j.mask ? At<T>(j.mask, j.ms, b, h, t) : nullptr;
        Scores<T>(j, q, kt, mrow, Sp, p);
        ExpShifted(p, lse[bh * j.T + t], p, Sp);  // P, recomputed (NaN lse: a NaN row)
        RowTimesRows(go, D, vt, Sp, ds, Sp);       // dP = dout . v_s
        for (size_t s = 0; s < S; ++s) ds[s] = p[s] * (ds[s] - rowdot);
        RowTimesRows(ds, S, kr, Dp, dq, Dp);       // dq = scale sum_s dS_s k_s
        T* dqrow = dqo + TokRow(j, b, h, t, j.T);
        for (size_t d = 0; d < D; ++d) dqrow[d] = round_to<T>(scale * dq[d]);
      }
      // dk_s += sum_t dS_ts q_t, dv_s += sum_t P_ts dout_t over the block, in t order.
      for (size_t s = 0; s < S; ++s) {
        AccumRows<true>(sb + s, Sp, nb, qb, Dp, dka + s * Dp, Dp);
        AccumRows<true>(pb + s, Sp, nb, gb, Dp, dva + s * Dp, Dp);
      }
    }
    for (size_t s = 0; s < S; ++s) {
      T* dkrow = dko + TokRow(j, b, h, s, S);
      T* dvrow = dvo + TokRow(j, b, h, s, S);
      for (size_t d = 0; d < D; ++d) {
        dkrow[d] = round_to<T>(scale * dka[s * Dp + d]);
        dvrow[d] = round_to<T>(dva[s * Dp + d]);
      }
    }
  }
}

void AttnFwd(const ad::Job& j, size_t begin, size_t end) {
  switch (j.dt) {
    case DType::BF16: return FwdHeads<bf16>(j, begin, end);
    case DType::F16: return FwdHeads<f16>(j, begin, end);
    case DType::F32: return FwdHeads<float>(j, begin, end);
    default: return FwdHeads<double>(j, begin, end);
  }
}

void AttnBwd(const ad::Job& j, size_t begin, size_t end) {
  switch (j.dt) {
    case DType::BF16: return BwdHeads<bf16>(j, begin, end);
    case DType::F16: return BwdHeads<f16>(j, begin, end);
    case DType::F32: return BwdHeads<float>(j, begin, end);
    default: return BwdHeads<double>(j, begin, end);
  }
}

}  // namespace taper::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace taper::cpu {
HWY_EXPORT(AttnFwd);
HWY_EXPORT(AttnBwd);

namespace attention_detail {
namespace {

void strides4(const Tensor& t, int64_t* st) {
  for (size_t i = 0; i < 4; ++i) st[i] = t.strides()[i];
}

/// The mask's strides over (B, H, T, S): its own, 0 along broadcast (size-1 or missing) dims.
void mask_strides(const Tensor& m, int64_t* st) {
  const size_t lead = 4 - m.rank();
  for (size_t i = 0; i < 4; ++i)
    st[i] = i < lead || m.dim(static_cast<int64_t>(i - lead)) == 1 ? 0 : m.strides()[i - lead];
}

Job make_job(const std::vector<Tensor>& in, const OpAttrs& a) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  TAPER_ASSERT(q.rank() == 4 && k.rank() == 4 && v.rank() == 4 && k.shape() == v.shape());
  Job j;
  j.dt = q.dtype();
  j.scale = a.f0;
  j.B = q.dim(0);
  j.H = q.dim(1);
  j.T = q.dim(2);
  j.D = q.dim(3);
  j.S = k.dim(2);
  j.q = q.data_ptr();
  j.k = k.data_ptr();
  j.v = v.data_ptr();
  strides4(q, j.qs);
  strides4(k, j.ks);
  strides4(v, j.vs);
  if (present(in, 3)) {
    TAPER_ASSERT(in[3].rank() <= 4 && in[3].dtype() == q.dtype());
    j.mask = in[3].data_ptr();
    mask_strides(in[3], j.ms);
  }
  return j;
}

void run(const Job& j, bool bwd) {
  const size_t heads = j.B * j.H;
  if (heads == 0 || j.T == 0) return;
  parallel_for(heads, 1, [&](size_t b, size_t e) {
    if (bwd) HWY_DYNAMIC_DISPATCH(AttnBwd)(j, b, e);
    else HWY_DYNAMIC_DISPATCH(AttnFwd)(j, b, e);
  });
}

/// A new (B, H, n, D) output shaped as x, stored token major (TokRow).
Tensor token_major(const Tensor& x) {
  return new_output(Shape({x.dim(0), x.dim(2), x.dim(1), x.dim(3)}), x.dtype())
      .permute({0, 2, 1, 3});
}

/// in = {q, k, v, mask or undefined}, attrs.f0 = scale. Returns {out, lse}.
std::vector<Tensor> attention_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  Job j = make_job(in, a);
  Tensor out = token_major(in[0]);
  Tensor lse = new_output(Shape({j.B, j.H, j.T}), stat_dtype(in[0].dtype()));
  j.out = out.data_ptr();
  j.lse = lse.data_ptr();
  run(j, false);
  return {out, lse};
}

/// in = {q, k, v, mask or undefined, out, lse, dout}, attrs.f0 = scale. Returns {dq, dk, dv}.
std::vector<Tensor> attention_bwd_kernel(const std::vector<Tensor>& in, const OpAttrs& a) {
  Job j = make_job(in, a);
  const Tensor &o = in[4], &lse = in[5], &dout = in[6];
  TAPER_ASSERT(o.shape() == in[0].shape() && dout.shape() == in[0].shape());
  TAPER_ASSERT(o.dtype() == in[0].dtype() && dout.dtype() == in[0].dtype());
  TAPER_ASSERT(lse.dtype() == stat_dtype(in[0].dtype()) && lse.elem_count() == j.B * j.H * j.T);
  const Tensor lc = lse.is_contiguous() ? lse : lse.detach().contiguous();
  Tensor dq = token_major(in[0]);
  Tensor dk = token_major(in[1]);
  Tensor dv = token_major(in[2]);
  j.o = o.data_ptr();
  j.dout = dout.data_ptr();
  strides4(o, j.os);
  strides4(dout, j.dos);
  j.lse = const_cast<void*>(lc.data_ptr());
  j.out = dq.data_ptr();
  j.dk = dk.data_ptr();
  j.dv = dv.data_ptr();
  run(j, true);
  if (j.T == 0) {  // no query rows: dk and dv are empty sums
    dk = Tensor::zeros(in[1].shape(), in[1].dtype(), Device::cpu());
    dv = Tensor::zeros(in[2].shape(), in[2].dtype(), Device::cpu());
  }
  return {dq, dk, dv};
}

struct Registrar {
  Registrar() {
    register_kernel(OpId::attention, DeviceKind::Cpu, kFloatDTypes, &attention_kernel);
    register_kernel(OpId::attention_bwd, DeviceKind::Cpu, kFloatDTypes, &attention_bwd_kernel);
  }
};
const Registrar registrar;

}  // namespace
}  // namespace attention_detail
}  // namespace taper::cpu
#endif  // HWY_ONCE
