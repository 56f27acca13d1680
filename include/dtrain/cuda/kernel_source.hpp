#pragma once
// CUDA C++ source of dtrain's device kernels, compiled at run time with NVRTC
// (cuda/nvrtc.hpp) so that dtrain stays header-only: the user's host compiler never sees device
// code. Self-contained: no #include, so NVRTC needs no header search path. The parameter block
// layout is DeviceCopyBatch in cuda/copy_plan.hpp (see Note [Batched copies] there).
//
// Half-precision conversions round to nearest even and keep NaN a NaN, like the host conversions
// in tensor/half.hpp, so device and host scaling give the same bits.
#include <array>
#include <string_view>

namespace dtrain::detail {

inline constexpr std::string_view kernel_source = R"DTRAIN_CUDA(
typedef long long i64;
typedef unsigned long long u64;

struct Desc {
  const void* src;
  void* dst;
  i64 count;
  i64 first_block;
};
struct Batch {
  Desc desc[96];
  int size;
  int elems_per_block;
  double scale;
  i64 blocks;
};
static_assert(sizeof(Desc) == 32, "Desc must match dtrain::detail::DeviceCopyDesc");
static_assert(sizeof(Batch) == 96 * 32 + 24, "Batch must match dtrain::detail::DeviceCopyBatch");

__device__ __forceinline__ int find_desc(const Batch& b, i64 block) {
  int lo = 0, hi = b.size - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.desc[mid].first_block <= block) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ float h2f(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float b2f(unsigned short b) {
  return __uint_as_float(((unsigned)b) << 16);
}
__device__ __forceinline__ unsigned short f2b(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

// Element kinds for scaled copies: storage type and "multiply by s".
struct Raw {  // any dtype moved as bytes, never scaled
  typedef unsigned char T;
  static __device__ __forceinline__ T scale(T v, double) { return v; }
};
struct F32 {
  typedef float T;
  static __device__ __forceinline__ T scale(T v, double s) { return v * (float)s; }
};
struct F64 {
  typedef double T;
  static __device__ __forceinline__ T scale(T v, double s) { return v * s; }
};
struct F16 {
  typedef unsigned short T;
  static __device__ __forceinline__ T scale(T v, double s) { return f2h(h2f(v) * (float)s); }
};
struct BF16 {
  typedef unsigned short T;
  static __device__ __forceinline__ T scale(T v, double s) { return f2b(b2f(v) * (float)s); }
};

// Copies n elements src -> dst (src null: zeros) with the block's threads, 16 bytes at a time
// when both ends are 16-byte aligned.
template <class E>
__device__ __forceinline__ void scaled_range(const typename E::T* src, typename E::T* dst, i64 n,
                                             double s) {
  typedef typename E::T T;
  const int V = 16 / sizeof(T);
  const bool aligned = ((((u64)src) | ((u64)dst)) & 15u) == 0;
  i64 done = 0;
  if (aligned) {
    const i64 nv = n / V;
    uint4* d4 = (uint4*)dst;
    if (src == 0) {
      const uint4 z = make_uint4(0u, 0u, 0u, 0u);
      for (i64 i = threadIdx.x; i < nv; i += blockDim.x) d4[i] = z;
    } else {
      const uint4* s4 = (const uint4*)src;
      for (i64 i = threadIdx.x; i < nv; i += blockDim.x) {
        union {
          uint4 v;
          T e[16 / sizeof(T)];
        } u;
        u.v = s4[i];
#pragma unroll
        for (int j = 0; j < V; ++j) u.e[j] = E::scale(u.e[j], s);
        d4[i] = u.v;
      }
    }
    done = nv * V;
  }
  for (i64 i = done + threadIdx.x; i < n; i += blockDim.x)
    dst[i] = src == 0 ? (T)0 : E::scale(src[i], s);
}

template <class E>
__device__ __forceinline__ void run_batch(const Batch& b) {
  typedef typename E::T T;
  for (i64 block = blockIdx.x; block < b.blocks; block += gridDim.x) {
    const Desc& d = b.desc[find_desc(b, block)];
    const i64 lo = (block - d.first_block) * (i64)b.elems_per_block;
    const i64 left = d.count - lo;
    const i64 n = left < (i64)b.elems_per_block ? left : (i64)b.elems_per_block;
    const T* src = d.src == 0 ? (const T*)0 : (const T*)d.src + lo;
    scaled_range<E>(src, (T*)d.dst + lo, n, b.scale);
  }
}

extern "C" __global__ void __launch_bounds__(256) dtrain_copy_raw(const Batch b) { run_batch<Raw>(b); }
extern "C" __global__ void __launch_bounds__(256) dtrain_scale_f32(const Batch b) { run_batch<F32>(b); }
extern "C" __global__ void __launch_bounds__(256) dtrain_scale_f64(const Batch b) { run_batch<F64>(b); }
extern "C" __global__ void __launch_bounds__(256) dtrain_scale_f16(const Batch b) { run_batch<F16>(b); }
extern "C" __global__ void __launch_bounds__(256) dtrain_scale_bf16(const Batch b) { run_batch<BF16>(b); }

// float32 <-> 16-bit conversions (gradient compression), scaled in float32, 4 elements a step.
struct ToF16 { static __device__ __forceinline__ unsigned short cvt(float v) { return f2h(v); } };
struct ToBF16 { static __device__ __forceinline__ unsigned short cvt(float v) { return f2b(v); } };
struct FromF16 { static __device__ __forceinline__ float cvt(unsigned short v) { return h2f(v); } };
struct FromBF16 { static __device__ __forceinline__ float cvt(unsigned short v) { return b2f(v); } };

template <class C>
__device__ __forceinline__ void narrow_range(const float* s, unsigned short* d, i64 n, float k) {
  i64 done = 0;
  if ((((u64)s) & 15u) == 0 && (((u64)d) & 7u) == 0) {
    const i64 nv = n / 4;
    for (i64 i = threadIdx.x; i < nv; i += blockDim.x) {
      const float4 x = ((const float4*)s)[i];
      uint2 y;
      y.x = (unsigned)C::cvt(x.x * k) | ((unsigned)C::cvt(x.y * k) << 16);
      y.y = (unsigned)C::cvt(x.z * k) | ((unsigned)C::cvt(x.w * k) << 16);
      ((uint2*)d)[i] = y;
    }
    done = nv * 4;
  }
  for (i64 i = done + threadIdx.x; i < n; i += blockDim.x) d[i] = C::cvt(s[i] * k);
}

template <class C>
__device__ __forceinline__ void widen_range(const unsigned short* s, float* d, i64 n, float k) {
  i64 done = 0;
  if ((((u64)s) & 7u) == 0 && (((u64)d) & 15u) == 0) {
    const i64 nv = n / 4;
    for (i64 i = threadIdx.x; i < nv; i += blockDim.x) {
      const uint2 x = ((const uint2*)s)[i];
      float4 y;
      y.x = C::cvt((unsigned short)(x.x & 0xffffu)) * k;
      y.y = C::cvt((unsigned short)(x.x >> 16)) * k;
      y.z = C::cvt((unsigned short)(x.y & 0xffffu)) * k;
      y.w = C::cvt((unsigned short)(x.y >> 16)) * k;
      ((float4*)d)[i] = y;
    }
    done = nv * 4;
  }
  for (i64 i = done + threadIdx.x; i < n; i += blockDim.x) d[i] = C::cvt(s[i]) * k;
}

template <class C, bool Narrow>
__device__ __forceinline__ void run_convert(const Batch& b) {
  const float k = (float)b.scale;
  for (i64 block = blockIdx.x; block < b.blocks; block += gridDim.x) {
    const Desc& d = b.desc[find_desc(b, block)];
    const i64 lo = (block - d.first_block) * (i64)b.elems_per_block;
    const i64 left = d.count - lo;
    const i64 n = left < (i64)b.elems_per_block ? left : (i64)b.elems_per_block;
    if (Narrow)
      narrow_range<C>((const float*)d.src + lo, (unsigned short*)d.dst + lo, n, k);
    else
      widen_range<C>((const unsigned short*)d.src + lo, (float*)d.dst + lo, n, k);
  }
}

extern "C" __global__ void __launch_bounds__(256) dtrain_narrow_f16(const Batch b) { run_convert<ToF16, true>(b); }
extern "C" __global__ void __launch_bounds__(256) dtrain_narrow_bf16(const Batch b) { run_convert<ToBF16, true>(b); }
extern "C" __global__ void __launch_bounds__(256) dtrain_widen_f16(const Batch b) { run_convert<FromF16, false>(b); }
extern "C" __global__ void __launch_bounds__(256) dtrain_widen_bf16(const Batch b) { run_convert<FromBF16, false>(b); }
)DTRAIN_CUDA";

// Kernel entry points, in the order of the KernelId enum.
enum class KernelId : int {
  copy_raw,
  scale_f32,
  scale_f64,
  scale_f16,
  scale_bf16,
  narrow_f16,
  narrow_bf16,
  widen_f16,
  widen_bf16,
};
inline constexpr std::array<const char*, 9> kernel_names = {
    "dtrain_copy_raw",   "dtrain_scale_f32",  "dtrain_scale_f64",
    "dtrain_scale_f16",  "dtrain_scale_bf16", "dtrain_narrow_f16",
    "dtrain_narrow_bf16", "dtrain_widen_f16", "dtrain_widen_bf16"};

}  // namespace dtrain::detail
