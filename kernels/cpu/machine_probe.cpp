// Two numbers about this machine, for the benchmarks' roofline (bench_agent/roofline.py):
// how fast its cores read memory, and how many multiply-adds per second they retire with
// the instructions the kernels use for each storage type (vdpbf16ps and, where the CPU has
// them, AMX tiles for bfloat16; FMA for float32). Built with the kernels' own flags, so the numbers are what those flags allow.
// The caller times each call; these only do the work.
#include <cstdint>

#include "amx.h"
#include "entries.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// Independent accumulators, enough to hide the instruction latency and still fit the
// vector registers (32 with AVX-512, 16 with AVX2).
constexpr int kChains = 24;
constexpr int kChainsAvx2 = 12;

#if defined(__AVX2__) || defined(__AVX512F__)
// Each of num_threads threads keeps kN accumulators (zero at first) in registers and, for
// `rounds` rounds, sets each to step(acc, x, w); returns the sum of every thread's
// accumulators (`lanes_sum` adds one accumulator's lanes).
template <int kN, typename Acc, typename In, typename Step, typename LanesSum>
float sum_of_chains(int64_t rounds, int num_threads, Acc zero, In x0, In w, Step step, LanesSum lanes_sum) {
    float total = 0.f;
#pragma omp parallel num_threads(num_threads) reduction(+ : total)
    {
        Acc acc[kN];
        for (auto &a : acc) a = zero;
        In x = x0;
        for (int64_t r = 0; r < rounds; r++) {
#pragma GCC unroll 24  // the accumulators must stay in registers
            for (int i = 0; i < kN; i++) acc[i] = step(acc[i], x, w);
            __asm__ volatile("" : "+x"(x));  // x may have changed: no hoisting across rounds
        }
        for (auto &a : acc) total += lanes_sum(a);
    }
    return total;
}
#endif

}  // namespace

extern "C" {

// The sum (mod 2^64) of words[0 .. count), read by num_threads threads in contiguous shares.
uint64_t probe_read(const uint64_t *words, int64_t count, int num_threads) {
    uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) num_threads(num_threads) schedule(static)
    for (int64_t i = 0; i < count; i++) sum += words[i];
    return sum;
}

// Each of num_threads threads runs `rounds` x kChains 512-bit vdpbf16ps (32 multiply-adds
// each): returns 0, or 1 when this build has no AVX512-BF16. *sink receives the sum of the
// accumulators, so that the work cannot be optimised away (and a test can count it).
int probe_bf16_dots(int64_t rounds, int num_threads, float *sink) {
#if defined(__AVX512BF16__)
    *sink = sum_of_chains<kChains>(
        rounds, num_threads, _mm512_setzero_ps(), (__m512bh)_mm512_set1_epi32(0x3f803f80),
        (__m512bh)_mm512_set1_epi32(0x3c003c00), [](__m512 a, __m512bh x, __m512bh w) { return _mm512_dpbf16_ps(a, x, w); },
        [](__m512 a) { return _mm512_reduce_add_ps(a); });
    return 0;
#else
    (void)rounds, (void)num_threads, (void)sink;
    return 1;
#endif
}

// Each thread runs `rounds` rounds of fused multiply-adds on the widest float32 vectors this
// build has (kChains of 16 lanes with AVX-512, kChainsAvx2 of 8 with AVX2 + FMA): returns
// the multiply-adds per round (384 or 96), or 0 when it has neither. *sink as above.
int probe_f32_fmas(int64_t rounds, int num_threads, float *sink) {
#if defined(__AVX512F__)
    *sink = sum_of_chains<kChains>(
        rounds, num_threads, _mm512_setzero_ps(), _mm512_set1_ps(1.0f), _mm512_set1_ps(1e-3f),
        [](__m512 a, __m512 x, __m512 w) { return _mm512_fmadd_ps(x, w, a); },
        [](__m512 a) { return _mm512_reduce_add_ps(a); });
    return kChains * 16;
#elif defined(__AVX2__) && defined(__FMA__)
    *sink = sum_of_chains<kChainsAvx2>(
        rounds, num_threads, _mm256_setzero_ps(), _mm256_set1_ps(1.0f), _mm256_set1_ps(1e-3f),
        [](__m256 a, __m256 x, __m256 w) { return _mm256_fmadd_ps(x, w, a); },
        [](__m256 a) {
            alignas(32) float lanes[8];
            _mm256_store_ps(lanes, a);
            float sum = 0.f;
            for (float l : lanes) sum += l;
            return sum;
        });
    return kChainsAvx2 * 8;
#else
    (void)rounds, (void)num_threads, (void)sink;
    return 0;
#endif
}

// Each of num_threads threads runs `rounds` rounds of four independent AMX tdpbf16ps (16 x 16
// accumulators, 32 bf16 products each; two input and two weight tiles, as linear_amx's
// blocks; six chains on one pair of tiles measured ~15% slower): returns the multiply-adds per round per thread
// (32,768), or 0 when this build or process has no AMX. *sink receives the sum of every
// accumulator, as above.
int probe_amx_tiles(int64_t rounds, int num_threads, float *sink) {
#if defined(FORKSERVE_AMX_HARDWARE)
    if (!linear_amx_available()) return 0;
    float total = 0.f;
#pragma omp parallel num_threads(num_threads) reduction(+ : total)
    {
        forkserve::load_tile_config();
        alignas(64) uint16_t ones[16 * 32], small[16 * 32];
        for (int i = 0; i < 16 * 32; i++) ones[i] = 0x3f80, small[i] = 0x3c00;  // bf16 1.0 and 2^-7
        alignas(64) float acc[16 * 16];
        TILE_ZERO(0);
        TILE_ZERO(1);
        TILE_ZERO(2);
        TILE_ZERO(3);
        TILE_LOADD(4, ones, 64);
        TILE_LOADD(5, ones, 64);
        TILE_LOADD(6, small, 64);
        TILE_LOADD(7, small, 64);
        for (int64_t r = 0; r < rounds; r++) {
            TILE_DPBF16PS(0, 4, 6);
            TILE_DPBF16PS(1, 4, 7);
            TILE_DPBF16PS(2, 5, 6);
            TILE_DPBF16PS(3, 5, 7);
        }
        float sum = 0.f;
        TILE_STORED(0, acc, 64);
        for (float a : acc) sum += a;
        TILE_STORED(1, acc, 64);
        for (float a : acc) sum += a;
        TILE_STORED(2, acc, 64);
        for (float a : acc) sum += a;
        TILE_STORED(3, acc, 64);
        for (float a : acc) sum += a;
        TILE_RELEASE();
        total += sum;
    }
    *sink = total;
    return 4 * 16 * 16 * 32;
#else
    (void)rounds, (void)num_threads, (void)sink;
    return 0;
#endif
}

}  // extern "C"
