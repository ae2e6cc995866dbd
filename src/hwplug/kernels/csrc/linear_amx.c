/*
 * Few-row bfloat16 linear layers on AMX tiles: y = x @ w^T + bias, read from
 * the weight as it lies (row-major [N, K] bfloat16), no packed copy.
 *
 * An AMX product multiplies a 16 x 32 bfloat16 tile by a tile in "VNNI"
 * layout (pairs of k side by side) into a 16 x 16 float32 tile. A GEMM
 * library puts the weight on the VNNI side, which means re-laying it out
 * (on every call, or once into a kept copy). Here the weight is the plain
 * side instead: sixteen of its rows, 32 k at a time, load straight into a
 * tile (rows ldw apart), and the few rows of x are laid out in VNNI once
 * per call (a few KiB). The tile product is then y^T for 16 output features
 * by 16 rows of x; it is stored and written back transposed, with the bias.
 * The weight is read from memory once a call, whatever the rows (x stays in
 * cache), so a decoding step runs at the memory's speed.
 *
 * Built by hwplug.kernels.native with -march=native: on a CPU with AMX-BF16
 * (and a kernel that lets the process use AMX's tile state, asked once with
 * arch_prctl) hwplug_linear_amx_ready() is 1; elsewhere it is 0 and
 * hwplug_linear_amx returns 2 so that callers take another path.
 *
 * Layouts (element strides; the last dimension is contiguous):
 *   x    [M, K] bfloat16, row stride ldx
 *   w    [N, K] bfloat16, row stride ldw
 *   bias [N] float32 or NULL
 *   y    [M, N] float32, or bfloat16 when y_bf16 (rounded to nearest even, as torch
 *        rounds), row stride ldy
 * K must be a multiple of 32 and N of 16 (else it returns 4). Work is split
 * over blocks of 32 output features (OpenMP, `threads` threads); products
 * of bfloat16 pairs are exact and summed in float32.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>

#include "linear_sizes.h"
#include <stdlib.h>
#include <string.h>

#include "bfloat16.h"

int hwplug_linear_amx_version(void) { return 2; }

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
enum { TILE = 16, KSTEP = 32, ROWS_AT_ONCE = 32 };

/* 1 when this process may use the tile registers (Linux asks a process to request it) */
static int ready = -1;

int hwplug_linear_amx_ready(void) {
    if (ready < 0) {
        ready = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    return ready;
}

/* The tile configuration: tiles 0-3 sums (16 features x 16 rows of x, float32), 4-5
 * weight rows (16 x 32 bfloat16), 6-7 rows of x in VNNI layout (16 pairs of k x 16 rows) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void configure(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = TILE;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

/* Rows [m0, m0 + 32) of x (zeros past M) in VNNI layout: for each 16 rows, K/2 lines of
 * 16 pairs (k, k + 1), 64 bytes a line. */
static void pack_rows(const uint16_t *x, int64_t M, int64_t K, int64_t ldx, int64_t m0,
                      uint32_t *packed) {
    for (int half = 0; half < 2; half++) {
        uint32_t *p = packed + (int64_t)half * (K / 2) * TILE;
        for (int j = 0; j < TILE; j++) {
            const int64_t m = m0 + half * TILE + j;
            if (m >= M) {
                for (int64_t kp = 0; kp < K / 2; kp++) p[kp * TILE + j] = 0;
                continue;
            }
            const uint16_t *row = x + m * ldx;
            for (int64_t kp = 0; kp < K / 2; kp++) memcpy(p + kp * TILE + j, row + 2 * kp, 4);
        }
    }
}

/* A 16 x 16 float32 tile of y^T (features n0.., rows m0..) written into y with the bias,
 * as float32 or rounded to bfloat16 */
static void write_back(const float *sums, int64_t n0, int64_t m0, int64_t M,
                       const float *bias, void *y, int64_t ldy, int y_bf16) {
    for (int j = 0; j < TILE && m0 + j < M; j++) {
        float row[TILE];
        for (int i = 0; i < TILE; i++) row[i] = sums[i * TILE + j] + (bias ? bias[n0 + i] : 0.0f);
        const int64_t at = (m0 + j) * ldy + n0;
        if (y_bf16) {
            uint16_t *out = (uint16_t *)y + at;
            for (int i = 0; i < TILE; i++) out[i] = f32_to_bf16(row[i]);
        } else {
            memcpy((float *)y + at, row, sizeof row);
        }
    }
}

int hwplug_linear_amx(const uint16_t *x, int64_t M, int64_t K, int64_t ldx, const uint16_t *w,
                      int64_t N, int64_t ldw, const float *bias, void *y, int64_t ldy,
                      int y_bf16, int threads) {
    if (!hwplug_linear_amx_ready()) return 2;
    if (!linear_sizes_ok(M, K, ldx, N, ldw, ldy)) return LINEAR_BAD_SIZES;
    if (K % KSTEP != 0 || N % TILE != 0) return 4;
    if (M <= 0 || N == 0) return 0;
    const int64_t chunks = (M + ROWS_AT_ONCE - 1) / ROWS_AT_ONCE;
    uint32_t *packed = aligned_alloc(64, (size_t)chunks * 2 * (K / 2) * TILE * sizeof(uint32_t));
    if (packed == NULL) return 1;
    for (int64_t c = 0; c < chunks; c++) {
        pack_rows(x, M, K, ldx, c * ROWS_AT_ONCE, packed + c * 2 * (K / 2) * TILE);
    }
    const int64_t blocks = (N + 2 * TILE - 1) / (2 * TILE);
    const int64_t stride = ldw * 2; /* bytes between weight rows */
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        configure();
        float sums[TILE * TILE] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t n0 = b * 2 * TILE;
            const int two = n0 + TILE < N; /* a second 16 features in this block */
            const uint16_t *w0 = w + n0 * ldw, *w1 = w0 + TILE * ldw;
            for (int64_t c = 0; c < chunks; c++) {
                const int64_t m0 = c * ROWS_AT_ONCE;
                const int second = m0 + TILE < M; /* a second 16 rows of x */
                const uint32_t *p0 = packed + c * 2 * (K / 2) * TILE;
                const uint32_t *p1 = p0 + (K / 2) * TILE;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int64_t k = 0; k < K; k += KSTEP) {
                    _tile_loadd(4, w0 + k, stride);
                    _tile_loadd(6, p0 + (k / 2) * TILE, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    if (two) {
                        _tile_loadd(5, w1 + k, stride);
                        _tile_dpbf16ps(1, 5, 6);
                    }
                    if (second) {
                        _tile_loadd(7, p1 + (k / 2) * TILE, 64);
                        _tile_dpbf16ps(2, 4, 7);
                        if (two) _tile_dpbf16ps(3, 5, 7);
                    }
                }
                _tile_stored(0, sums, 64);
                write_back(sums, n0, m0, M, bias, y, ldy, y_bf16);
                if (two) {
                    _tile_stored(1, sums, 64);
                    write_back(sums, n0 + TILE, m0, M, bias, y, ldy, y_bf16);
                }
                if (second) {
                    _tile_stored(2, sums, 64);
                    write_back(sums, n0, m0 + TILE, M, bias, y, ldy, y_bf16);
                    if (two) {
                        _tile_stored(3, sums, 64);
                        write_back(sums, n0 + TILE, m0 + TILE, M, bias, y, ldy, y_bf16);
                    }
                }
            }
        }
        _tile_release();
    }
    free(packed);
    return 0;
}

#else /* built without AMX-BF16: callers take another path */

int hwplug_linear_amx_ready(void) { return 0; }

int hwplug_linear_amx(const uint16_t *x, int64_t M, int64_t K, int64_t ldx, const uint16_t *w,
                      int64_t N, int64_t ldw, const float *bias, void *y, int64_t ldy,
                      int y_bf16, int threads) {
    (void)x, (void)M, (void)K, (void)ldx, (void)w, (void)N, (void)ldw, (void)bias, (void)y;
    (void)ldy, (void)y_bf16, (void)threads;
    return 2;
}

#endif
