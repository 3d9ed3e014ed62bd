// vec_io.cuh: the loads and stores of the fused kernels (softmax.cu, norm.cu, attention.cu): storage values
// widened to the compute type C = compute_t<T>, and C values rounded once to T at the store,
// one element or one 16-byte vector (kVec<T> elements) at a time.
//
// Rounding: round_to<T>'s bits for every value (portable.h, the contract every device keeps).
// For bf16/f16 the hardware conversions give those bits for every value but NaN (the hardware
// writes its canonical NaN, round_to keeps the sign and payload, quieted), so NaN goes through
// round_to and everything else through cvt.rn (two values per instruction in a vector store):
// the bit-by-bit portable routine costs about seven integer instructions per element, which made
// the half-type kernels bound by instruction issue, not by memory. Vector stores test the whole
// vector for NaN once (kMayNaN); a caller whose values cannot be NaN says so (kMayNaN = false)
// and skips the test.
// Widening: bf16 is its f32's high half (one shift or mask per element); f16 through cvt
// (exact, as widen).
// Also here: exp_ns_half, the half types' exp (softmax.cu, attention.cu), and cp.async, the
// copies that keep rows in flight ahead of their use.
// What it is not: alignment decisions (the kernels check 16-byte alignment on the host) or
// element-wise fallbacks over partial vectors (each kernel family guards its own bounds).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "taper/portable.h"

namespace taper::cuda {

/// Elements of one 16-byte vector.
template <class T> inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

/// A storage value in the compute type (exact).
template <class T> __device__ __forceinline__ compute_t<T> load_c(T v) {
  if constexpr (std::is_same_v<T, f16>) return __half2float(__ushort_as_half(v.bits));
  else if constexpr (std::is_same_v<T, bf16>) return __uint_as_float(uint32_t{v.bits} << 16);
  else return widen(v);
}

/// A compute value rounded once to T (round_to's bits). kMayNaN = false: v is not NaN.
template <class T, bool kMayNaN = true> __device__ __forceinline__ T store_c(compute_t<T> v) {
  if constexpr (is_half_v<T>) {
    if (kMayNaN && v != v) return round_to<T>(v);
    if constexpr (std::is_same_v<T, f16>)
      return f16::from_bits(__half_as_ushort(__float2half_rn(v)));
    else return bf16::from_bits(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
  } else {
    return round_to<T>(v);
  }
}

/// Two f32 values, neither NaN, rounded once to the half type T and packed (a in the low half):
/// one cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32.
template <class T> __device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  uint32_t w;
  if constexpr (std::is_same_v<T, bf16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&w, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    memcpy(&w, &h, 4);
  }
  return w;
}

/// The kVec<T> values of one 16-byte word, widened.
template <class T>
__device__ __forceinline__ void widen16(const uint4& w, compute_t<T> (&v)[kVec<T>]) {
  if constexpr (is_half_v<T>) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<T, bf16>) {
        v[2 * i] = __uint_as_float(u[i] << 16);
        v[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
      } else {
        __half2 h;
        memcpy(&h, &u[i], 4);
        const float2 f = __half22float2(h);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
      }
    }
  } else {
    T e[kVec<T>];
    memcpy(&e[0], &w, 16);
#pragma unroll
    for (int l = 0; l < kVec<T>; ++l) v[l] = e[l];
  }
}

/// One aligned 16-byte vector at p, widened. kLast: the data's last use (evict-first);
/// otherwise through the read-only path.
template <bool kLast, class T>
__device__ __forceinline__ void load16(const T* p, compute_t<T> (&v)[kVec<T>]) {
  const uint4 w = kLast ? __ldcs(reinterpret_cast<const uint4*>(p))
                        : __ldg(reinterpret_cast<const uint4*>(p));
  widen16<T>(w, v);
}

/// One aligned 16-byte vector at p, each value rounded once (round_to's bits). kLast: streaming
/// store. kMayNaN = false: no value is NaN (no test).
template <bool kLast, bool kMayNaN, class T>
__device__ __forceinline__ void store16(T* p, const compute_t<T> (&v)[kVec<T>]) {
  uint4 w;
  if constexpr (is_half_v<T>) {
    bool nan = false;
    if constexpr (kMayNaN) {
#pragma unroll
      for (int l = 0; l < kVec<T>; ++l) nan |= v[l] != v[l];
    }
    if (__builtin_expect(nan, 0)) {
      T e[kVec<T>];
#pragma unroll
      for (int l = 0; l < kVec<T>; ++l) e[l] = round_to<T>(v[l]);
      memcpy(&w, &e[0], 16);
    } else {
      w = make_uint4(pack_half2<T>(v[0], v[1]), pack_half2<T>(v[2], v[3]),
                     pack_half2<T>(v[4], v[5]), pack_half2<T>(v[6], v[7]));
    }
  } else {
    T e[kVec<T>];
#pragma unroll
    for (int l = 0; l < kVec<T>; ++l) e[l] = v[l];
    memcpy(&w, &e[0], 16);
  }
  if (kLast) __stcs(reinterpret_cast<uint4*>(p), w);
  else *reinterpret_cast<uint4*>(p) = w;
}

/// A 16-byte vector of kVec<T> copies of v rounded to T (round_to's bits): a padding word.
template <class T> __device__ __forceinline__ uint4 splat16(compute_t<T> v) {
  T e[kVec<T>];
#pragma unroll
  for (int l = 0; l < kVec<T>; ++l) e[l] = store_c<T>(v);
  uint4 w;
  memcpy(&w, &e[0], 16);
  return w;
}

/// cp.async: one 16-byte vector (gmem and smem 16-byte aligned) or one Bytes-sized word (4, 8;
/// aligned to its size) copied from global to shared memory without holding a register, for the
/// kernels that keep rows in flight ahead of their use. It lands once the issuing thread's
/// cp_async_wait<N>() covers its group, and is then visible to that thread only (other threads
/// of the block need a barrier after it).
template <int Bytes> __device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16);
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (Bytes == 16)  // .cg: through L2 only (the data is read once)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(gmem), "n"(Bytes)
                 : "memory");
}
/// Closes the calling thread's current group of cp.async copies.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/// Waits until at most N of the calling thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// A persistent block's row loop, its inputs copied S - 1 iterations ahead: for b = base, base +
/// stride, ... < R, body(stage, b) runs after prefetch(stage, b) has landed, where prefetch
/// issues the calling thread's cp.async copies of iteration b into `stage` (one of S stages of
/// `per` 16-byte slots from `smem`; it must copy nothing for b >= R). A thread may read only
/// the slots it copied itself (no barrier here); a stage is refilled once the iteration that
/// read it is over. base and stride uniform across whatever barriers body holds.
template <int S, class Prefetch, class Body>
__device__ __forceinline__ void pipelined_rows(int64_t base, int64_t stride, int64_t R,
                                               uint4* smem, int per, Prefetch prefetch,
                                               Body body) {
  static_assert(S >= 2);
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    prefetch(smem + s * per, base + s * stride);
    cp_async_commit();
  }
  for (int s = 0; base < R; base += stride, s = s + 1 == S ? 0 : s + 1) {
    // The stage the previous iteration read: this thread's reads of it are done.
    prefetch(smem + (s == 0 ? S - 1 : s - 1) * per, base + (S - 1) * stride);
    cp_async_commit();
    cp_async_wait<S - 1>();  // this iteration's group has landed
    body(static_cast<const uint4*>(smem + s * per), base);
  }
  cp_async_wait<0>();  // nothing left in flight at exit
}

/// exp_ns for the half types' f32 values: 2^(t log2 e) through the hardware's ex2.approx.ftz,
/// the product t log2 e taken with log2 e split in two (hi + lo, one fma), so the result is
/// within a few f32 ulp of expf's (a relative 2^-21 or so): at most a ten-thousandth of a bf16
/// or f16 half-ulp, so it moves a rounded value by one unit only when the exact value lies that
/// close to a rounding boundary. Three instructions where expf takes about ten, which made the
/// half-type softmax (and attention's score loops) bound by instruction issue. The flush below ln FLT_MIN is exp_ns's; f32 and
/// f64 data keep exp_ns (expf / exp), since their outputs keep those bits.
__device__ __forceinline__ float exp_ns_half(float t) {
  const float z = fmaf(t, 0x1.715476p+0f, t * 0x1.4ae0c0p-26f);
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z));
  asm("{\n\t.reg .pred p;\n\tsetp.lt.f32 p, %1, %2;\n\tselp.f32 %0, 0f00000000, %3, p;\n\t}"
      : "=f"(r)
      : "f"(t), "f"(-0x1.5d58ap+6f), "f"(e));
  return r;
}
}  // namespace taper::cuda
