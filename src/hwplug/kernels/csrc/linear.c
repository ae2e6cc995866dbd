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

#include "linear_sizes.h"

int hwplug_linear_version(void) { return 2; }

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
        }
        for (int i = 0; i < rows; i++) {
            vec a = VLOAD(x + i * ldx + k);
            /* one load of x for the NR products: kept from being folded into each FMA as a
             * memory operand, which made NR loads of it (the loads, not the FMAs, bound) */
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

/* the lanes of k the kernel multiplies at a time (0: no vector path) */
int hwplug_linear_simd(void) { return LANES; }

int hwplug_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const void *w, int kind,
                  int64_t N, int64_t ldw, const float *bias, float *y, int64_t ldy,
                  int threads) {
    if (kind < 0 || kind > 2) {
        return 1;
    }
    if (!linear_sizes_ok(M, K, ldx, N, ldw, ldy)) return LINEAR_BAD_SIZES;

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
