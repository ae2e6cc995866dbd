/*
 * Few-row bfloat16 linear layers with AVX-512 BF16 dot products: y = x @ w^T
 * + bias, read from the weight as it lies (row-major [N, K] bfloat16), no
 * packed or widened copy.
 *
 * On a CPU with AVX512_BF16 but no AMX (AMD Zen 4 and later, Intel Cooper
 * Lake), one VDPBF16PS multiplies 16 pairs of bfloat16 from each operand
 * and adds each pair's two products into a float32 lane: twice the
 * products of a float32 FMA for the same registers, and the weight is
 * read in its own 16 bits. Both operands here have k contiguous (a row of
 * x, a row of w), which is exactly the instruction's layout, so nothing is
 * re-laid: tiles of 8 rows of x by 3 weight rows (24 accumulators of the
 * 32 registers), 32 k a step, lane sums taken together at the end (as in
 * linear.c), a ragged end of k read with a mask (zeros add nothing), and
 * the next tile's weight rows prefetched into L2 while a tile is multiplied.
 *
 * Products of bfloat16 pairs are exact in float32 and summed in float32;
 * like every AVX512_BF16 product (and oneDNN's on these CPUs), subnormal
 * bfloat16 inputs (below about 1e-38) count as zero.
 *
 * Built by hwplug.kernels.native with -march=native: on such a CPU
 * hwplug_linear_dpbf16_ready() is 1; elsewhere it is 0 and
 * hwplug_linear_dpbf16 returns 2 so that callers take another path.
 *
 * Layouts (element strides; the last dimension is contiguous):
 *   x    [M, K] bfloat16, row stride ldx
 *   w    [N, K] bfloat16, row stride ldw
 *   bias [N] float32 or NULL
 *   y    [M, N] float32, or bfloat16 when y_bf16 (rounded to nearest even, as torch
 *        rounds), row stride ldy
 * Work is split over tiles of 3 output features (OpenMP, `threads` threads).
 */
#include <stddef.h>
#include <stdint.h>

#include "linear_sizes.h"

#include "bfloat16.h"

int hwplug_linear_dpbf16_version(void) { return 1; }

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include "simd.h"

int hwplug_linear_dpbf16_ready(void) { return 1; }

enum { MR = 8, NR = 3, KSTEP = 32, NACC = 32 /* MR * NR rounded up to whole lane groups */ };

/* 32 bfloat16 of `row` from k (the first `mask` bits of them; the rest zero) */
static inline __attribute__((always_inline)) __m512bh load_pairs(const uint16_t *row,
                                                                 __mmask32 mask) {
    if (mask == (__mmask32)0xFFFFFFFFu) return (__m512bh)_mm512_loadu_si512(row);
    return (__m512bh)_mm512_maskz_loadu_epi16(mask, row);
}

/* One step of 32 k: each of the rows of x by each of the cols weight rows. */
static inline __attribute__((always_inline)) void step(int rows, int cols, const uint16_t *x,
                                                       int64_t ldx, const uint16_t *w,
                                                       int64_t ldw, __mmask32 mask,
                                                       __m512 *acc) {
    __m512bh b[NR];
    for (int j = 0; j < cols; j++) b[j] = load_pairs(w + j * ldw, mask);
    for (int i = 0; i < rows; i++) {
        const __m512bh a = load_pairs(x + i * ldx, mask);
        for (int j = 0; j < cols; j++) acc[i * NR + j] = _mm512_dpbf16_ps(acc[i * NR + j], a, b[j]);
    }
}

/* rows x cols outputs; rows and cols are constants where it is inlined, so the
 * accumulators live in registers. `next` (or NULL) is the tile after this one: its rows
 * `ahead`, ahead + `stride`, ... below `next_cols` are prefetched into L2 as k goes. */
static inline __attribute__((always_inline)) void tile(
    int rows, int cols, const uint16_t *next, int next_cols, int ahead, int stride,
    const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw, int64_t K,
    const float *bias, void *y, int64_t ldy, int y_bf16) {
    __m512 acc[NACC];
    for (int i = 0; i < NACC; i++) acc[i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + KSTEP <= K; k += KSTEP) {
        if (next) {
            for (int r = ahead; r < next_cols; r += stride) {
                _mm_prefetch((const char *)(next + r * ldw + k), _MM_HINT_T1);
            }
        }
        step(rows, cols, x + k, ldx, w + k, ldw, (__mmask32)0xFFFFFFFFu, acc);
    }
    if (k < K) { /* the ragged end: masked loads, zeros past K */
        step(rows, cols, x + k, ldx, w + k, ldw, (__mmask32)((1u << (K - k)) - 1u), acc);
    }
    float sums[NACC];
    tile_sums(acc, (rows - 1) * NR + cols, sums);
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
            const float s = sums[i * NR + j] + (bias ? bias[j] : 0.0f);
            if (y_bf16) {
                ((uint16_t *)y)[i * ldy + j] = f32_to_bf16(s);
            } else {
                ((float *)y)[i * ldy + j] = s;
            }
        }
    }
}

typedef void (*tile_fn)(const uint16_t *, int, int, int, const uint16_t *, int64_t,
                        const uint16_t *, int64_t, int64_t, const float *, void *, int64_t,
                        int);

#define TILE(ROWS, COLS)                                                                     \
    static void tile_##ROWS##_##COLS(const uint16_t *next, int next_cols, int ahead,         \
                                     int stride, const uint16_t *x, int64_t ldx,             \
                                     const uint16_t *w, int64_t ldw, int64_t K,              \
                                     const float *bias, void *y, int64_t ldy, int y_bf16) {  \
        tile(ROWS, COLS, next, next_cols, ahead, stride, x, ldx, w, ldw, K, bias, y, ldy,    \
             y_bf16);                                                                        \
    }
#define TILE_ROWS(ROWS) TILE(ROWS, 1) TILE(ROWS, 2) TILE(ROWS, 3)
#define ROW_FNS(ROWS) {tile_##ROWS##_1, tile_##ROWS##_2, tile_##ROWS##_3}
TILE_ROWS(1) TILE_ROWS(2) TILE_ROWS(3) TILE_ROWS(4)
TILE_ROWS(5) TILE_ROWS(6) TILE_ROWS(7) TILE_ROWS(8)

static const tile_fn TILES[MR][NR] = {ROW_FNS(1), ROW_FNS(2), ROW_FNS(3), ROW_FNS(4),
                                      ROW_FNS(5), ROW_FNS(6), ROW_FNS(7), ROW_FNS(8)};

/* Returns 0, or 2 where this CPU has no AVX512_BF16 (built without it). */
int hwplug_linear_dpbf16(const uint16_t *x, int64_t M, int64_t K, int64_t ldx,
                         const uint16_t *w, int64_t N, int64_t ldw, const float *bias, void *y,
                         int64_t ldy, int y_bf16, int threads) {
    if (!linear_sizes_ok(M, K, ldx, N, ldw, ldy)) return LINEAR_BAD_SIZES;
    const int64_t tiles = (N + NR - 1) / NR;
    const size_t item = y_bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n0 = t * NR;
        const int cols = (int)(N - n0 < NR ? N - n0 : NR);
        const uint16_t *wt = w + n0 * ldw;
        const int64_t after = N - n0 - NR;
        const int next_cols = (int)(after < NR ? after : NR);
        /* (one row of x is better left to the hardware prefetcher, as in linear.c) */
        const uint16_t *next = next_cols > 0 && M > 1 ? wt + NR * ldw : NULL;
        const int passes = (int)((M + MR - 1) / MR);
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int rows = (int)(M - m0 < MR ? M - m0 : MR);
            TILES[rows - 1][cols - 1](next, next_cols, (int)(m0 / MR), passes, x + m0 * ldx,
                                      ldx, wt, ldw, K, bias ? bias + n0 : NULL,
                                      (char *)y + (size_t)(m0 * ldy + n0) * item, ldy, y_bf16);
        }
    }
    return 0;
}

#else /* no AVX512_BF16: callers take AMX, the float32 vector path or oneDNN */

int hwplug_linear_dpbf16_ready(void) { return 0; }

int hwplug_linear_dpbf16(const uint16_t *x, int64_t M, int64_t K, int64_t ldx,
                         const uint16_t *w, int64_t N, int64_t ldw, const float *bias, void *y,
                         int64_t ldy, int y_bf16, int threads) {
    (void)x, (void)M, (void)K, (void)ldx, (void)w, (void)N, (void)ldw, (void)bias, (void)y;
    (void)ldy, (void)y_bf16, (void)threads;
    return 2;
}

#endif
