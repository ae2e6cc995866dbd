/*
 * The vector width hwplug's native CPU kernels are built for, shared by
 * linear.c and paged_decode.c. Included where the compiler targets AVX2, FMA
 * and F16C (HWPLUG_SIMD is then defined); with AVX-512F the same kernel code
 * runs on 16 lanes in 512-bit registers, otherwise on 8 lanes in 256-bit ones.
 * Each width names its float vector, its vector of 16-bit values (half as
 * wide) and the few operations the kernels use.
 */
#ifndef HWPLUG_SIMD_H
#define HWPLUG_SIMD_H

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define HWPLUG_SIMD 1
#include <immintrin.h>
#include <stdint.h>

#if defined(__AVX512F__)
enum { LANES = 16 };
typedef __m512 vec;
typedef __m512i veci;
typedef __m256i vec16;
#define VZERO() _mm512_setzero_ps()
#define VSET1(x) _mm512_set1_ps(x)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VMIN(a, b) _mm512_min_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VFNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define VROUND(a) _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n) /* 2^n for integral float n in the normal range */                    \
    _mm512_castsi512_ps(_mm512_slli_epi32(                                               \
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define VLOAD16(p) _mm256_loadu_si256((const __m256i *)(p))
#define VWIDEN_BF16(h) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
#define VWIDEN_F16(h) _mm512_cvtph_ps(h)
static inline float lane_sum(__m512 v) { return _mm512_reduce_add_ps(v); }
static inline float lane_max(__m512 v) { return _mm512_reduce_max_ps(v); }
/* The lane sums of LANES vectors at once: element i of the result is the sum of v[i]'s
 * lanes (a transposing tree of adds, a few instructions a vector instead of a reduction
 * each) */
static inline __attribute__((always_inline)) __m512 lane_sums(const __m512 *v) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++) { /* each 128-bit lane: a, b, a, b partial sums */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    }
    for (int j = 0; j < 4; j++) { /* each 128-bit lane: v[4j], ..., v[4j + 3] */
        const __m512d c = _mm512_castps_pd(t[2 * j]), d = _mm512_castps_pd(t[2 * j + 1]);
        u[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
    }
    /* 128-bit lanes 0+1 and 2+3 of u[0], u[1] (then u[2], u[3]); then the halves */
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                                    _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88),
                                    _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}
#else
enum { LANES = 8 };
typedef __m256 vec;
typedef __m256i veci;
typedef __m128i vec16;
#define VZERO() _mm256_setzero_ps()
#define VSET1(x) _mm256_set1_ps(x)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VMIN(a, b) _mm256_min_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VFNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define VROUND(a) _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n)                                                                          \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                               \
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define VLOAD16(p) _mm_loadu_si128((const __m128i *)(p))
#define VWIDEN_BF16(h) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
#define VWIDEN_F16(h) _mm256_cvtph_ps(h)
static inline float lane_sum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}
static inline float lane_max(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}
/* The lane sums of LANES vectors at once: element i of the result is the sum of v[i]'s lanes */
static inline __attribute__((always_inline)) __m256 lane_sums(const __m256 *v) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
#endif

/* The lane sums of acc[0..used) into sums (the linear kernels' tiles): a few one by one,
 * more a group of LANES at a time (acc holds whole groups: those past `used` are read,
 * and their sums written, but not used) */
static inline __attribute__((always_inline)) void tile_sums(const vec *acc, int used,
                                                            float *sums) {
    if (used <= 4) {
        for (int i = 0; i < used; i++) sums[i] = lane_sum(acc[i]);
    } else {
        for (int i = 0; i < used; i += LANES) VSTORE(sums + i, lane_sums(acc + i));
    }
}

/* The kinds of 32- and 16-bit floats the kernels read. */
enum { SIMD_F32 = 0, SIMD_BF16 = 1, SIMD_F16 = 2 };

/* LANES values from element i of a float32, bfloat16 or float16 array, as float32 */
static inline __attribute__((always_inline)) vec load_widened(const void *p, int64_t i,
                                                              int kind) {
    if (kind == SIMD_F32) {
        return VLOAD((const float *)p + i);
    }
    vec16 h = VLOAD16((const uint16_t *)p + i);
    return kind == SIMD_BF16 ? VWIDEN_BF16(h) : VWIDEN_F16(h);
}

/* e^x on every lane, to about 2 ulp (Cephes' polynomial on x - n ln 2); inputs below
 * -87.3 give about 1e-38 (not 0), above 88.3 infinity; a NaN stays NaN */
static inline __attribute__((always_inline)) vec vexp(vec x) {
    /* max/min return their second operand when either is NaN: x is kept */
    x = VMIN(VSET1(88.3762626647949f), VMAX(VSET1(-87.3365447504f), x));
    const vec n = VROUND(VMUL(x, VSET1(1.44269504088896341f)));
    vec r = VFNMA(n, VSET1(0.693359375f), x);
    r = VFNMA(n, VSET1(-2.12194440e-4f), r);
    vec p = VSET1(1.9875691500e-4f);
    p = VFMA(p, r, VSET1(1.3981999507e-3f));
    p = VFMA(p, r, VSET1(8.3334519073e-3f));
    p = VFMA(p, r, VSET1(4.1665795894e-2f));
    p = VFMA(p, r, VSET1(1.6666665459e-1f));
    p = VFMA(p, r, VSET1(5.0000001201e-1f));
    p = VADD(VFMA(p, VMUL(r, r), r), VSET1(1.0f));
    return VMUL(p, VPOW2I(n));
}

#endif /* AVX2, FMA, F16C */
#endif /* HWPLUG_SIMD_H */
