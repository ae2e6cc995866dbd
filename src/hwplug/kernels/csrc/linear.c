/*
 * Few-row linear layers for CPUs: y = x @ w^T + bias, read straight from the
 * weight as it lies (row-major [N, K], 32-bit or 16-bit floats), no packed or
 * converted copy. Decoding multiplies a handful of rows by every weight of
 * the model on each step; a GEMM library either repacks the weight into its
 * blocked layout on every call or keeps a packed second copy. Here each
 * weight row is read once per MR rows of x and multiplied in registers:
 * tiles of up to MR rows of x by NR rows of w (8 x 3 with AVX-512's 32
 * registers, 4 x 3 with AVX2's 16), LANES lanes of k at a time with FMAs,
 * the tile's lane sums taken together at the end (16-bit weights widened in
 * registers). While a tile is multiplied, the next tile's weight rows are
 * prefetched into L2, spread over the passes of x's rows, so that the
 * memory reads of the weight overlap the arithmetic instead of following it.
 *
 * Built on first use by hwplug.kernels.native with the system C compiler.
 * The vector path needs AVX2, FMA and F16C (-march=native on such a CPU);
 * compiled without them, hwplug_linear_simd() is 0 and hwplug_linear returns
 * 2 so that callers take oneDNN or torch instead. Built for a CPU with
 * AVX-512F, it uses 512-bit registers and hwplug_linear_simd() is 16.
 *
 * Layouts (element strides; the last dimension is contiguous):
 *   x    [M, K] float32, row stride ldx
 *   w    [N, K] in `kind` (0 float32, 1 bfloat16, 2 float16), row stride ldw
 *   bias [N] float32 or NULL
 *   y    [M, N] float32, row stride ldy
 * Work is split over tiles of NR output features (OpenMP, `threads` threads);
 * every product is summed in float32.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "bfloat16.h"
#include "linear_sizes.h"

int hwplug_linear_version(void) { return 4; }

#include "simd.h"

#if defined(HWPLUG_SIMD)

enum { KIND_F32 = SIMD_F32, KIND_BF16 = SIMD_BF16, KIND_F16 = SIMD_F16 };
#if defined(__AVX512F__) /* 24 accumulators of the 32 registers */
enum { MR = 8, NR = 3 };
#else /* 12 of the 16 */
enum { MR = 4, NR = 3 };
#endif
/* the accumulators, rounded up to whole groups of LANES for lane_sums */
enum { NACC = (MR * NR + LANES - 1) / LANES * LANES };

static inline __attribute__((always_inline)) float load1(const void *w, int64_t i, int kind) {
    if (kind == KIND_F32) {
        return ((const float *)w)[i];
    }
    uint16_t h = ((const uint16_t *)w)[i];
    if (kind == KIND_BF16) {
        union { uint32_t u; float f; } bits = {(uint32_t)h << 16};
        return bits.f;
    }
    return _cvtsh_ss(h);
}

/* rows x cols outputs; rows, cols and kind are constants where it is inlined, so the
 * accumulators live in registers (MR x NR of them, NR weight vectors, 1 row of x).
 * `next` (or NULL) is the weight of the tile after this one: its rows `ahead`,
 * ahead + `stride`, ... below `next_cols` are prefetched into L2 as k goes. */
static inline __attribute__((always_inline)) void tile(
    int rows, int cols, int kind, const char *next, int next_cols, int ahead, int stride,
    const float *x, int64_t ldx, const void *w, int64_t ldw, int64_t K, const float *bias,
    float *y, int64_t ldy) {
    const int64_t item = kind == KIND_F32 ? 4 : 2;
    vec acc[NACC];
    for (int i = 0; i < NACC; i++) {
        acc[i] = VZERO();
    }
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) {
        if (next) {
            for (int r = ahead; r < next_cols; r += stride) {
                _mm_prefetch(next + (r * ldw + k) * item, _MM_HINT_T1);
            }
        }
        vec b[NR];
        for (int j = 0; j < cols; j++) {
            b[j] = load_widened(w, j * ldw + k, kind);
            /* one load of each weight vector for the tile's rows of x: GCC otherwise folds
             * it into every FMA as a memory operand, rows loads of it instead of one
             * (16 loads a step for 12 FMAs at 4 x 3, load-bound; measured with the 250M
             * model's float32 shapes on a 2-core AVX2 Zen: 16 rows 75 -> 120-135 GFLOPS,
             * 8 rows 78 -> 100-110, the tile alone in L1 38 -> 64 GFLOPS on one core) */
            __asm__("" : "+v"(b[j]));
        }
        for (int i = 0; i < rows; i++) {
            vec a = VLOAD(x + i * ldx + k);
            /* likewise one load of x for the NR products */
            __asm__("" : "+v"(a));
            for (int j = 0; j < cols; j++) {
                acc[i * NR + j] = VFMA(a, b[j], acc[i * NR + j]);
            }
        }
    }
    float sums[NACC];
    tile_sums(acc, (rows - 1) * NR + cols, sums);
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
            float s = sums[i * NR + j];
            for (int64_t t = k; t < K; t++) {
                s += x[i * ldx + t] * load1(w, j * ldw + t, kind);
            }
            y[i * ldy + j] = bias ? s + bias[j] : s;
        }
    }
}

typedef void (*tile_fn)(const char *, int, int, int, const float *, int64_t, const void *,
                        int64_t, int64_t, const float *, float *, int64_t);

#define TILE(KIND, ROWS, COLS)                                                                 \
    static void tile_##KIND##_##ROWS##_##COLS(                                                 \
        const char *next, int next_cols, int ahead, int stride, const float *x, int64_t ldx,   \
        const void *w, int64_t ldw, int64_t K, const float *bias, float *y, int64_t ldy) {     \
        tile(ROWS, COLS, KIND, next, next_cols, ahead, stride, x, ldx, w, ldw, K, bias, y,     \
             ldy);                                                                             \
    }
#define TILE_ROWS(KIND, ROWS) TILE(KIND, ROWS, 1) TILE(KIND, ROWS, 2) TILE(KIND, ROWS, 3)
#define ROW_FNS(KIND, ROWS) \
    {tile_##KIND##_##ROWS##_1, tile_##KIND##_##ROWS##_2, tile_##KIND##_##ROWS##_3}
#if defined(__AVX512F__)
#define TILE_KIND(KIND)                                                                        \
    TILE_ROWS(KIND, 1) TILE_ROWS(KIND, 2) TILE_ROWS(KIND, 3) TILE_ROWS(KIND, 4)                \
    TILE_ROWS(KIND, 5) TILE_ROWS(KIND, 6) TILE_ROWS(KIND, 7) TILE_ROWS(KIND, 8)
#define KIND_FNS(KIND)                                                                         \
    {ROW_FNS(KIND, 1), ROW_FNS(KIND, 2), ROW_FNS(KIND, 3), ROW_FNS(KIND, 4),                   \
     ROW_FNS(KIND, 5), ROW_FNS(KIND, 6), ROW_FNS(KIND, 7), ROW_FNS(KIND, 8)}
#else
#define TILE_KIND(KIND) \
    TILE_ROWS(KIND, 1) TILE_ROWS(KIND, 2) TILE_ROWS(KIND, 3) TILE_ROWS(KIND, 4)
#define KIND_FNS(KIND) \
    {ROW_FNS(KIND, 1), ROW_FNS(KIND, 2), ROW_FNS(KIND, 3), ROW_FNS(KIND, 4)}
#endif
TILE_KIND(0)
TILE_KIND(1)
TILE_KIND(2)

static const tile_fn TILES[3][MR][NR] = {KIND_FNS(0), KIND_FNS(1), KIND_FNS(2)};

/* One row of x by a bfloat16 weight (a decoding step of one sequence): a tile of
 * ROW_TILE weight rows at a time, 2 x LANES values of k a step. The weight is
 * read in whole vectors of 16-bit values and widened by interleaving each with
 * zeros (unpacklo/unpackhi), which keeps k's values in an order within each 128-bit
 * lane ([0-3, 8-11], [4-7, 12-15], ...) instead of the widening load and shift of
 * the tile path; x is permuted once per call to that order. Fewer instructions a
 * weight byte and twelve weight rows streaming at once per thread: measured on a
 * 2-core AVX2 Zen (benchmarks/bench_linear_row.py), about 1.3x the tile path's rate
 * for one row. Needs AVX-512BW for 512-bit registers (16-bit unpacks). */
#if !defined(__AVX512F__) || defined(__AVX512BW__)
#define HWPLUG_ROW_BF16 1
enum { ROW_TILE = 12, ROW_ACC = (ROW_TILE + LANES - 1) / LANES * LANES, ROW_STEP = 2 * LANES };
#if defined(__AVX512F__)
typedef __m512i vecw;
#define WLOAD(p) _mm512_loadu_si512((const void *)(p))
#define WLO(h) _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), h))
#define WHI(h) _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), h))
#else
typedef __m256i vecw;
#define WLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define WLO(h) _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), h))
#define WHI(h) _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), h))
#endif

/* x[0 .. K - K % ROW_STEP) in the order the unpacks widen the weight's values in */
static void row_order(const float *x, int64_t K, float *xp) {
    for (int64_t k = 0; k + ROW_STEP <= K; k += ROW_STEP) {
        for (int p = 0; p < LANES; p++) {
            xp[k + p] = x[k + 8 * (p / 4) + p % 4];
            xp[k + LANES + p] = x[k + 8 * (p / 4) + 4 + p % 4];
        }
    }
}

static inline void put(void *y, int64_t i, int y_bf16, float v) {
    if (y_bf16) {
        ((uint16_t *)y)[i] = f32_to_bf16(v);
    } else {
        ((float *)y)[i] = v;
    }
}

/* y[0 .. ROW_TILE) = x . w[0 .. ROW_TILE)^T (+ bias); xp is x in row_order */
static void row_tile_bf16(const float *xp, const float *x, int64_t K, const uint16_t *w,
                          int64_t ldw, const float *bias, void *y, int64_t n0, int y_bf16) {
    vec acc[ROW_ACC];
    for (int i = 0; i < ROW_ACC; i++) {
        acc[i] = VZERO();
    }
    int64_t k = 0;
    for (; k + ROW_STEP <= K; k += ROW_STEP) {
        const vec x0 = VLOAD(xp + k), x1 = VLOAD(xp + k + LANES);
        for (int r = 0; r < ROW_TILE; r++) {
            const vecw h = WLOAD(w + r * ldw + k);
            acc[r] = VFMA(x0, WLO(h), acc[r]);
            acc[r] = VFMA(x1, WHI(h), acc[r]);
        }
    }
    float sums[ROW_ACC];
    tile_sums(acc, ROW_TILE, sums);
    for (int r = 0; r < ROW_TILE; r++) {
        float v = sums[r];
        for (int64_t t = k; t < K; t++) {
            v += x[t] * load1(w, r * ldw + t, KIND_BF16);
        }
        put(y, n0 + r, y_bf16, bias ? v + bias[n0 + r] : v);
    }
}

/* One row of float32 x by a bfloat16 weight into y (float32, or bfloat16 when y_bf16):
 * ROW_TILE rows of w at a time, the last N % ROW_TILE by the tile path. `xp` has room
 * for K floats (x's reordered copy). */
static void row_bf16(const float *x, float *xp, int64_t K, const uint16_t *w, int64_t N,
                     int64_t ldw, const float *bias, void *y, int y_bf16, int threads) {
    row_order(x, K, xp);
    const int64_t whole = N / ROW_TILE;
    const int64_t items = whole + (N - whole * ROW_TILE + NR - 1) / NR;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
    for (int64_t t = 0; t < items; t++) {
        if (t < whole) {
            row_tile_bf16(xp, x, K, w + t * ROW_TILE * ldw, ldw, bias, y, t * ROW_TILE, y_bf16);
        } else {
            const int64_t n0 = whole * ROW_TILE + (t - whole) * NR;
            const int cols = (int)(N - n0 < NR ? N - n0 : NR);
            float part[NR];
            TILES[KIND_BF16][0][cols - 1](NULL, 0, 0, 1, x, K, w + n0 * ldw, ldw, K,
                                          bias ? bias + n0 : NULL, part, NR);
            for (int j = 0; j < cols; j++) {
                put(y, n0 + j, y_bf16, part[j]);
            }
        }
    }
}

enum { ROW_STACK = 4096 }; /* in features whose copies of x are kept on the stack */

/* row_bf16 for one row of x, float32 or (x_bf16) bfloat16: x's copies (its reordered
 * copy, after a widened one for bfloat16) on the stack, or for long rows in a buffer
 * of their own; 1 when that buffer cannot be had (nothing is written then). */
static int row_call(const void *x, int x_bf16, int64_t K, const uint16_t *w, int64_t N,
                    int64_t ldw, const float *bias, void *y, int y_bf16, int threads) {
    float stack[2 * ROW_STACK];
    float *buffer =
        K <= ROW_STACK ? stack : malloc((size_t)(x_bf16 ? 2 : 1) * (size_t)K * sizeof(float));
    if (!buffer) {
        return 1;
    }
    const float *xf = (const float *)x;
    float *xp = buffer;
    if (x_bf16) {
        for (int64_t k = 0; k < K; k++) {
            buffer[k] = bf16_to_f32(((const uint16_t *)x)[k]);
        }
        xf = buffer;
        xp = buffer + K;
    }
    row_bf16(xf, xp, K, w, N, ldw, bias, y, y_bf16, threads);
    if (buffer != stack) {
        free(buffer);
    }
    return 0;
}
#endif

/* One row of float32 x by a float32 weight (a float32 decoding step of one sequence):
 * F32_TILE weight rows at a time, 2 x LANES values of k a step, x's two vectors loaded
 * once for the tile's rows. The tile path's three weight rows a thread leave the memory
 * system idle between its reads; six streams keep it busy (measured on a 2-core AVX2 Zen
 * with the 250M model's shapes, interleaved: 5-13% over three; eight or twelve gained no
 * more, and at 4 KiB rows, as for 1024 in features, more than seven rows plus x's line
 * share one set of an 8-way L1). The last N % F32_TILE rows go to the tile path. */
enum { F32_TILE = 6, F32_ACC = (F32_TILE + LANES - 1) / LANES * LANES, F32_STEP = 2 * LANES };

static void row_tile_f32(const float *x, int64_t K, const float *w, int64_t ldw,
                         const float *bias, float *y) {
    vec acc[F32_ACC];
    for (int i = 0; i < F32_ACC; i++) {
        acc[i] = VZERO();
    }
    int64_t k = 0;
    for (; k + F32_STEP <= K; k += F32_STEP) {
        const vec x0 = VLOAD(x + k), x1 = VLOAD(x + k + LANES);
        for (int r = 0; r < F32_TILE; r++) {
            acc[r] = VFMA(x0, VLOAD(w + r * ldw + k), acc[r]);
            acc[r] = VFMA(x1, VLOAD(w + r * ldw + k + LANES), acc[r]);
        }
    }
    for (; k + LANES <= K; k += LANES) {
        const vec x0 = VLOAD(x + k);
        for (int r = 0; r < F32_TILE; r++) {
            acc[r] = VFMA(x0, VLOAD(w + r * ldw + k), acc[r]);
        }
    }
    float sums[F32_ACC];
    tile_sums(acc, F32_TILE, sums);
    for (int r = 0; r < F32_TILE; r++) {
        float v = sums[r];
        for (int64_t t = k; t < K; t++) {
            v += x[t] * w[r * ldw + t];
        }
        y[r] = bias ? v + bias[r] : v;
    }
}

static void row_f32(const float *x, int64_t K, const float *w, int64_t N, int64_t ldw,
                    const float *bias, float *y, int threads) {
    const int64_t whole = N / F32_TILE;
    const int64_t items = whole + (N - whole * F32_TILE + NR - 1) / NR;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
    for (int64_t t = 0; t < items; t++) {
        if (t < whole) {
            const int64_t n0 = t * F32_TILE;
            row_tile_f32(x, K, w + n0 * ldw, ldw, bias ? bias + n0 : NULL, y + n0);
        } else {
            const int64_t n0 = whole * F32_TILE + (t - whole) * NR;
            const int cols = (int)(N - n0 < NR ? N - n0 : NR);
            TILES[KIND_F32][0][cols - 1](NULL, 0, 0, 1, x, K, w + n0 * ldw, ldw, K,
                                         bias ? bias + n0 : NULL, y + n0, NR);
        }
    }
}

/* the lanes of k the kernel multiplies at a time (0: no vector path) */
int hwplug_linear_simd(void) { return LANES; }

int hwplug_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const void *w, int kind,
                  int64_t N, int64_t ldw, const float *bias, float *y, int64_t ldy,
                  int threads) {
    if (kind < 0 || kind > 2) {
        return 1;
    }
    if (!linear_sizes_ok(M, K, ldx, N, ldw, ldy)) return LINEAR_BAD_SIZES;

#if defined(HWPLUG_ROW_BF16)
    /* (without room for x's copy, the tile path below takes it) */
    if (M == 1 && kind == KIND_BF16 && N >= ROW_TILE && K > 0 &&
        row_call(x, 0, K, (const uint16_t *)w, N, ldw, bias, y, 0, threads) == 0) {
        return 0;
    }
#endif
    if (M == 1 && kind == KIND_F32 && N >= F32_TILE && K > 0) {
        row_f32(x, K, (const float *)w, N, ldw, bias, y, threads);
        return 0;
    }
    const size_t item = kind == KIND_F32 ? 4 : 2;
    const int64_t tiles = (N + NR - 1) / NR;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n0 = t * NR;
        const int cols = (int)(N - n0 < NR ? N - n0 : NR);
        const char *wt = (const char *)w + (size_t)(n0 * ldw) * item;
        /* the next tile's rows are prefetched while this one is multiplied, one share of
         * them in each pass over x's rows */
        const int64_t after = N - n0 - NR;
        const int next_cols = (int)(after < NR ? after : NR);
        /* (one row of x is better left to the hardware prefetcher) */
        const char *next = next_cols > 0 && M > 1 ? wt + (size_t)(NR * ldw) * item : NULL;
        const int passes = (int)((M + MR - 1) / MR);
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int rows = (int)(M - m0 < MR ? M - m0 : MR);
            TILES[kind][rows - 1][cols - 1](next, next_cols, (int)(m0 / MR), passes,
                                            x + m0 * ldx, ldx, wt, ldw, K,
                                            bias ? bias + n0 : NULL, y + m0 * ldy + n0, ldy);
        }
    }
    return 0;
}

#else /* no AVX2/FMA/F16C: callers use oneDNN or torch */

int hwplug_linear_simd(void) { return 0; }

int hwplug_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const void *w, int kind,
                  int64_t N, int64_t ldw, const float *bias, float *y, int64_t ldy,
                  int threads) {
    (void)x, (void)M, (void)K, (void)ldx, (void)w, (void)kind, (void)N, (void)ldw;
    (void)bias, (void)y, (void)ldy, (void)threads;
    return 2;
}

#endif

/* y[1, N] = x[1, K] . w[N, K]^T + bias for a bfloat16 x and weight (a decoding step
 * of one sequence): the one-row path, x widened once; y float32, or bfloat16 when
 * y_bf16 (rounded to nearest even). The signature of the pairs kernels (linear_amx.c):
 * x's row stride is unused. 1: no memory for x's copies; 2: this build has no one-row
 * path (callers take the vector path); 3: sizes refused. */
int hwplug_linear_row_bf16(const uint16_t *x, int64_t M, int64_t K, int64_t ldx,
                           const uint16_t *w, int64_t N, int64_t ldw, const float *bias,
                           void *y, int64_t ldy, int y_bf16, int threads) {
#if defined(HWPLUG_ROW_BF16)
    if (!linear_sizes_ok(M, K, ldx, N, ldw, ldy) || M != 1) return LINEAR_BAD_SIZES;
    if (N == 0) return 0;
    return row_call(x, 1, K, w, N, ldw, bias, y, y_bf16, threads);
#else
    (void)x, (void)M, (void)K, (void)ldx, (void)w, (void)N, (void)ldw, (void)bias, (void)y;
    (void)ldy, (void)y_bf16, (void)threads;
    return 2;
#endif
}

int hwplug_linear_row_bf16_ready(void) {
#if defined(HWPLUG_ROW_BF16)
    return 1;
#else
    return 0;
#endif
}
