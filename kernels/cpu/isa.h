// Which vector instruction sets the kernels are built for, as two switches the sources test:
//
//   FORKSERVE_AVX512       AVX-512 F, DQ, BW and VL (every AVX-512 CPU since Skylake-SP)
//   FORKSERVE_AVX512_BF16  the above and AVX512-BF16 (Zen 4, Cooper Lake, Sapphire Rapids on)
//
// Normally they follow the compiler's target (-march=native). Built with
// -DFORKSERVE_AVX512_EMULATE (kernels/cpu/build.py does so when FORKSERVE_AVX512_EMULATE=1)
// on a CPU with AVX2 and FMA but no AVX-512, both are set and every _mm512_* intrinsic the
// kernels use comes from SIMDe (https://github.com/simd-everywhere/simde, Debian's
// libsimde-dev), which carries each one out with AVX2 instructions or plain C. The AVX-512
// kernels' logic (tiling, masks, tails, threading, rounding to bfloat16) is then tested on
// CPUs without AVX-512 (tests/test_avx512_emulated.py); the library is slower and for tests
// only. The machine probe does not follow these switches: it measures the real CPU.
#pragma once

#if defined(FORKSERVE_AVX512_EMULATE)
#if !defined(__AVX2__) || !defined(__FMA__) || defined(__AVX512F__)
#error "FORKSERVE_AVX512_EMULATE is for CPUs with AVX2 and FMA and without AVX-512"
#endif
#include <immintrin.h>
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include "avx512_emulated.h"
#define FORKSERVE_AVX512 1
#define FORKSERVE_AVX512_BF16 1
#else
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define FORKSERVE_AVX512 1
#if defined(__AVX512BF16__)
#define FORKSERVE_AVX512_BF16 1
#endif
#endif
#endif
