// The storage types the CPU kernels read and write, and their conversions to float32.
//
// bfloat16 travels as raw bits (torch's layout); arithmetic is always float32, and results
// are rounded to nearest even on the way out, as PyTorch's own CPU kernels do.
#pragma once

#include <cstdint>
#include <cstring>

namespace forkserve {

struct Bf16 {
    uint16_t bits;
};

inline float to_f32(float x) { return x; }

inline float to_f32(Bf16 x) {
    uint32_t u = static_cast<uint32_t>(x.bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

inline void from_f32(float x, float *dst) { *dst = x; }

inline void from_f32(float x, Bf16 *dst) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
        dst->bits = static_cast<uint16_t>((u >> 16) | 0x40);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    dst->bits = static_cast<uint16_t>(u >> 16);
}

// What the CPUs' bfloat16 dot products (vdpbf16ps, tdpbf16ps) and vcvtneps2bf16 do with
// denormals, for the emulations of those instructions (avx512_emulated.h, amx.h): inputs read
// as zero, results flushed to zero, signs kept.
inline float flush_denormal(float f) {
    uint32_t word;
    std::memcpy(&word, &f, sizeof word);
    if ((word & 0x7f800000u) != 0) return f;
    word &= 0x80000000u;
    std::memcpy(&f, &word, sizeof f);
    return f;
}

inline float to_f32_denormals_as_zero(uint16_t bits) { return flush_denormal(to_f32(Bf16{bits})); }

// x rounded to T and back: where PyTorch stores an intermediate in T, so do we.
template <typename T>
inline float rounded(float x) {
    T t;
    from_f32(x, &t);
    return to_f32(t);
}

template <typename T>
inline void load_row(const T *src, float *dst, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = to_f32(src[i]);
}

}  // namespace forkserve
