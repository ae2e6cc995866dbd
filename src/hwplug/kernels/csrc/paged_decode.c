/*
 * Paged decode attention for CPUs: one query token per sequence, keys and
 * values read where they lie in the paged cache (no gathered copy).
 *
 * Built on first use by hwplug.kernels.cpu_decode with the system C compiler
 * (-O3 -march=native, OpenMP when the compiler has it) and loaded with
 * ctypes; torch's own OpenMP runtime is already loaded, so the kernel shares
 * its threads.
 *
 * Layouts (element strides are given; the last dimension is contiguous):
 *   query  [n, kv_heads, group, head_size] float32 or bfloat16 (`qkind`),
 *          contiguous
 *   cache  [num_blocks, block_size, kv_heads, head_size] in `kind`
 *   table  [n, table_stride] int64 block ids (only the first blocks of each
 *          row that cover its length are read)
 *   lens   [n] int64 sequence lengths (the query is the last position)
 *   out    [n, kv_heads, group, head_size] in the query's kind, contiguous
 *   new_keys, new_values  [rows, kv_heads, head_size] in the cache's kind,
 *          contiguous, or NULL; slots [rows] int64
 * When given, row i of the new keys and values is stored in cache slot
 * slots[i] (block slots[i] / block_size, position slots[i] % block_size; a
 * negative slot is a padding row, not stored) before anything is read: the
 * step's writes and its decode attention are one call.
 * Each (sequence, key/value head) pair is one work item: its `group` query
 * rows attend to positions [max(0, len - window), len) with an online
 * softmax taken a page at a time, in float32 (a bfloat16 query is widened
 * first and the result rounded to nearest even, as torch rounds).
 *
 * Where the build has AVX2/FMA/F16C (simd.h), 32- and 16-bit caches with a
 * head size that is a multiple of the vector width (up to 16 vectors) and
 * groups of up to 8 query rows take a vector path: each key row is read
 * once for the group's dot products, whose lane sums are taken a vector of
 * positions at a time; the page's softmax runs a vector at a time; each
 * value row is read once for the group's sums, which stay in registers over
 * the page. It is compiled for each group at head sizes 64 and 128 (the
 * query and sum vectors then live in registers) and once for any shape.
 * Other caches (fp8 codes) and shapes take the scalar path.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_F32 = 0, KIND_BF16 = 1, KIND_F16 = 2, KIND_CODES = 3 };

#define MAX_BLOCK 256

#include "bfloat16.h"
#include "simd.h"

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* One row of `head_size` cache elements as float32 into `dst` (float32 rows are read in place). */
static inline const float *load_row(const void *base, int64_t offset, int kind, int head_size,
                                    const float *lut, float *dst) {
    switch (kind) {
    case KIND_F32:
        return (const float *)base + offset;
    case KIND_BF16: {
        const uint16_t *src = (const uint16_t *)base + offset;
        for (int d = 0; d < head_size; d++) dst[d] = bf16_to_f32(src[d]);
        return dst;
    }
    case KIND_F16: {
        const uint16_t *src = (const uint16_t *)base + offset;
        for (int d = 0; d < head_size; d++) dst[d] = f16_to_f32(src[d]);
        return dst;
    }
    default: {
        const uint8_t *src = (const uint8_t *)base + offset;
        for (int d = 0; d < head_size; d++) dst[d] = lut[src[d]];
        return dst;
    }
    }
}

/* What the online softmax keeps for `rows` query rows across pages, laid out in a work
 * buffer: acc [rows * head_size], max [rows], sum [rows], then the page's scores
 * [rows * MAX_BLOCK] (row r's at scores + r * MAX_BLOCK). */
typedef struct {
    float *acc, *row_max, *row_sum, *scores;
} rows_state;

static rows_state rows_begin(float *work, int rows, int head_size) {
    rows_state s;
    s.acc = work;
    s.row_max = s.acc + (int64_t)rows * head_size;
    s.row_sum = s.row_max + rows;
    s.scores = s.row_sum + rows;
    for (int64_t i = 0; i < (int64_t)rows * head_size; i++) s.acc[i] = 0.0f;
    for (int r = 0; r < rows; r++) {
        s.row_max[r] = -INFINITY;
        s.row_sum[r] = 0.0f;
    }
    return s;
}

/* The largest of a page's `count` scores (-INFINITY when none); a NaN score (a NaN query
 * or key) is skipped here and makes the sums NaN later. */
static float page_max(const float *sr, int count) {
    float m = -INFINITY;
    for (int p = 0; p < count; p++) m = sr[p] > m ? sr[p] : m;
    return m;
}

/* Row r's maximum over what it has seen and a page whose largest score is `seen`; what
 * the row has summed so far is rescaled to it. */
static float rows_rescale(rows_state *s, int r, float seen, int head_size) {
    const float before = s->row_max[r];
    const float m = seen > before ? seen : before;
    const float correction = before == m ? 1.0f : (before == -INFINITY ? 0.0f : expf(before - m));
    if (correction != 1.0f) {
        s->row_sum[r] *= correction;
        float *ar = s->acc + (int64_t)r * head_size;
        for (int d = 0; d < head_size; d++) ar[d] *= correction;
    }
    s->row_max[r] = m;
    return m;
}

/* Each row's sums divided by its softmax denominator, into out [rows, head_size]. */
static void rows_finish(const rows_state *s, int rows, int head_size, float *out) {
    for (int r = 0; r < rows; r++) {
        const float inv = 1.0f / s->row_sum[r];
        const float *ar = s->acc + (int64_t)r * head_size;
        float *o = out + (int64_t)r * head_size;
        for (int d = 0; d < head_size; d++) o[d] = ar[d] * inv;
    }
}

/* The first position a query at `len - 1` sees. */
static int64_t first_seen(int64_t len, int64_t window) {
    return (window > 0 && len > window) ? len - window : 0;
}

/* The page starting at position `start`: the offset of its first seen position (from
 * `first` on) and, in *count, how many of its positions are seen (up to len). */
static int64_t page_span(int64_t start, int64_t first, int64_t len, const int64_t *table,
                         int block_size, int64_t block_stride, int64_t pos_stride, int *count) {
    const int64_t lo = start < first ? first : start;
    const int64_t hi = start + block_size < len ? start + block_size : len;
    *count = (int)(hi - lo);
    return table[start / block_size] * block_stride + (lo - start) * pos_stride;
}

/* Heads [head, head + heads) of one sequence: rows = heads * group query rows. */
static void attend_one(const float *q, const void *key_cache, const void *value_cache, int kind,
                       const float *lut, int64_t block_stride, int64_t pos_stride,
                       int64_t head_stride, const int64_t *table, int64_t len, int head,
                       int heads, int group, int head_size, int block_size, int64_t window,
                       float scale, float *out, float *work) {
    /* work: the rows' state (rows_begin), then row [head_size] */
    const int rows = heads * group;
    rows_state state = rows_begin(work, rows, head_size);
    float *acc = state.acc, *scores = state.scores;
    float *row = scores + (int64_t)rows * MAX_BLOCK;
    const int64_t first = first_seen(len, window);
    for (int64_t start = first - first % block_size; start < len; start += block_size) {
        int count;
        const int64_t page =
            page_span(start, first, len, table, block_size, block_stride, pos_stride, &count);
        /* the scores of this page's positions */
        for (int p = 0; p < count; p++) {
            for (int h = 0; h < heads; h++) {
                const int64_t at = page + p * pos_stride + (int64_t)(head + h) * head_stride;
                const float *k = load_row(key_cache, at, kind, head_size, lut, row);
                for (int g = 0; g < group; g++) {
                    const int r = h * group + g;
                    const float *qr = q + (int64_t)r * head_size;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int d = 0; d < head_size; d++) s += qr[d] * k[d];
                    scores[r * MAX_BLOCK + p] = s * scale;
                }
            }
        }
        /* the online softmax: each row's new maximum rescales what it has summed */
        for (int r = 0; r < rows; r++) {
            float *sr = scores + r * MAX_BLOCK;
            const float m = rows_rescale(&state, r, page_max(sr, count), head_size);
            float total = 0.0f;
            for (int p = 0; p < count; p++) {
                sr[p] = expf(sr[p] - m);
                total += sr[p];
            }
            state.row_sum[r] += total;
        }
        /* the page's values, weighted */
        for (int p = 0; p < count; p++) {
            for (int h = 0; h < heads; h++) {
                const int64_t at = page + p * pos_stride + (int64_t)(head + h) * head_stride;
                const float *v = load_row(value_cache, at, kind, head_size, lut, row);
                for (int g = 0; g < group; g++) {
                    const int r = h * group + g;
                    const float w = scores[r * MAX_BLOCK + p];
                    float *ar = acc + (int64_t)r * head_size;
#pragma omp simd
                    for (int d = 0; d < head_size; d++) ar[d] += w * v[d];
                }
            }
        }
    }
    rows_finish(&state, rows, head_size, out);
}

#if defined(HWPLUG_SIMD)
enum { MAX_VECTORS = 16, MAX_GROUP = 8 };

/* Rows of heads [head, head + heads) at `count` positions from element `page` of `cache`
 * fetched into L1 only, not into L2 or L3 (a non-temporal hint): the cache is read once
 * a step, and left out of the shared cache it does not evict the weights there. */
static inline void fetch_page(const void *cache, int64_t page, int count, int64_t pos_stride,
                              int64_t head_stride, int head, int heads, int head_size,
                              int bytes) {
    const char *base = (const char *)cache;
    for (int p = 0; p < count; p++) {
        for (int h = 0; h < heads; h++) {
            const char *row = base + (page + p * pos_stride + (int64_t)(head + h) * head_stride) * bytes;
            for (int b = 0; b < head_size * bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_NTA);
        }
    }
}

static int vector_path(int kind, int group, int head_size) {
    return kind != KIND_CODES && group <= MAX_GROUP && head_size % LANES == 0 &&
           head_size / LANES <= MAX_VECTORS;
}

/* The online softmax of a page's `count` scores of each of `rows` rows: each row's new
 * maximum rescales what it has summed, and its scores become their exponentials. */
static void page_softmax(rows_state *state, int rows, int count, int head_size) {
    const int padded = (count + LANES - 1) / LANES * LANES;
    for (int r = 0; r < rows; r++) {
        float *sr = state->scores + r * MAX_BLOCK;
        for (int p = count; p < padded; p++) sr[p] = -INFINITY;
        /* VMAX keeps its second operand where the first is NaN: NaN scores are skipped */
        vec top = VSET1(-INFINITY);
        for (int p = 0; p < padded; p += LANES) top = VMAX(VLOAD(sr + p), top);
        const vec m = VSET1(rows_rescale(state, r, lane_max(top), head_size));
        for (int p = 0; p < padded; p += LANES) {
            VSTORE(sr + p, vexp(VFNMA(VSET1(1.0f), m, VLOAD(sr + p))));
        }
        for (int p = count; p < padded; p++) sr[p] = 0.0f; /* vexp gives ~1e-38, not 0 */
        vec total = VZERO();
        for (int p = 0; p < padded; p += LANES) total = VADD(total, VLOAD(sr + p));
        state->row_sum[r] += lane_sum(total);
    }
}

/* Key/value heads [head, head + heads) of one sequence: their rows = heads * group query
 * rows q [rows, head_size] attend as in attend_one; out as q. work: the rows' state.
 * `nv` (vectors a head) and `group` are constants where this is inlined for a common
 * shape, so that the group's query and sum vectors live in registers: each key row is
 * read once for its group's dot products, whose lane sums are taken LANES positions at
 * a time; each value row is read once for its group's sums. */
static inline __attribute__((always_inline)) void
attend_vec_shape(const float *q, const void *key_cache, const void *value_cache, int kind,
                 int64_t block_stride, int64_t pos_stride, int64_t head_stride,
                 const int64_t *table, int64_t len, int head, int heads, const int group,
                 const int nv, int block_size, int64_t window, float scale, float *out,
                 float *work) {
    const int head_size = nv * LANES;
    const int rows = heads * group;
    rows_state state = rows_begin(work, rows, head_size);
    float *acc = state.acc, *scores = state.scores;
    const int64_t first = first_seen(len, window);
    const vec scaled = VSET1(scale);
    const int bytes = kind == KIND_F32 ? 4 : 2;
    for (int64_t start = first - first % block_size; start < len; start += block_size) {
        int count;
        const int64_t page =
            page_span(start, first, len, table, block_size, block_stride, pos_stride, &count);
        int next_count = 0;
        int64_t next_page = 0;
        if (start + block_size < len) {
            next_page = page_span(start + block_size, first, len, table, block_size,
                                  block_stride, pos_stride, &next_count);
            fetch_page(key_cache, next_page, next_count, pos_stride, head_stride, head, heads,
                       head_size, bytes);
        }
        /* scores: LANES positions at a time, their dot vectors summed lane-wise at once */
        for (int h = 0; h < heads; h++) {
            const float *qh = q + (int64_t)h * group * head_size;
            const int64_t at_head = page + (int64_t)(head + h) * head_stride;
            vec qv[MAX_GROUP * MAX_VECTORS];
            for (int i = 0; i < group * nv; i++) qv[i] = VLOAD(qh + (int64_t)i * LANES);
            for (int p0 = 0; p0 < count; p0 += LANES) {
                const int n = count - p0 < LANES ? count - p0 : LANES;
                vec dots[MAX_GROUP][LANES];
                for (int p = 0; p < n; p++) {
                    const int64_t at = at_head + (int64_t)(p0 + p) * pos_stride;
                    vec k[MAX_VECTORS];
                    for (int v = 0; v < nv; v++) k[v] = load_widened(key_cache, at + v * LANES, kind);
                    for (int g = 0; g < group; g++) {
                        vec d = VMUL(qv[g * nv], k[0]);
                        for (int v = 1; v < nv; v++) d = VFMA(qv[g * nv + v], k[v], d);
                        dots[g][p] = d;
                    }
                }
                for (int g = 0; g < group; g++) {
                    for (int p = n; p < LANES; p++) dots[g][p] = VZERO();
                    /* p0 + LANES <= MAX_BLOCK: a page has at most MAX_BLOCK positions */
                    VSTORE(scores + (h * group + g) * MAX_BLOCK + p0,
                           VMUL(lane_sums(dots[g]), scaled));
                }
            }
        }
        page_softmax(&state, rows, count, head_size);
        fetch_page(value_cache, next_page, next_count, pos_stride, head_stride, head, heads,
                   head_size, bytes);
        /* the page's values: the group's sums stay in registers over the page */
        for (int h = 0; h < heads; h++) {
            float *ah = acc + (int64_t)h * group * head_size;
            const float *wh = scores + h * group * MAX_BLOCK;
            const int64_t at_head = page + (int64_t)(head + h) * head_stride;
            vec sums[MAX_GROUP * MAX_VECTORS];
            for (int i = 0; i < group * nv; i++) sums[i] = VLOAD(ah + (int64_t)i * LANES);
            for (int p = 0; p < count; p++) {
                const int64_t at = at_head + (int64_t)p * pos_stride;
                vec x[MAX_VECTORS];
                for (int v = 0; v < nv; v++) x[v] = load_widened(value_cache, at + v * LANES, kind);
                for (int g = 0; g < group; g++) {
                    const vec w = VSET1(wh[g * MAX_BLOCK + p]);
                    for (int v = 0; v < nv; v++) sums[g * nv + v] = VFMA(w, x[v], sums[g * nv + v]);
                }
            }
            for (int i = 0; i < group * nv; i++) VSTORE(ah + (int64_t)i * LANES, sums[i]);
        }
    }
    rows_finish(&state, rows, head_size, out);
}

/* attend_vec_shape, specialised for every group it takes (1..MAX_GROUP) at the head sizes
 * of most models (64 and 128); other head sizes run it as it is */
static void attend_vec(const float *q, const void *key_cache, const void *value_cache, int kind,
                       int64_t block_stride, int64_t pos_stride, int64_t head_stride,
                       const int64_t *table, int64_t len, int head, int heads, int group,
                       int head_size, int block_size, int64_t window, float scale, float *out,
                       float *work) {
    const int nv = head_size / LANES;
#define SHAPE(G, NV)                                                                          \
    case (G) * 64 + (NV):                                                                     \
        attend_vec_shape(q, key_cache, value_cache, kind, block_stride, pos_stride,           \
                         head_stride, table, len, head, heads, G, NV, block_size, window,     \
                         scale, out, work);                                                   \
        return;
/* head sizes 64 and 128 */
#define SHAPES(G) SHAPE(G, 64 / LANES) SHAPE(G, 128 / LANES)
    switch (group * 64 + nv) {
        SHAPES(1)
        SHAPES(2)
        SHAPES(3)
        SHAPES(4)
        SHAPES(5)
        SHAPES(6)
        SHAPES(7)
        SHAPES(8)
    default:
        attend_vec_shape(q, key_cache, value_cache, kind, block_stride, pos_stride, head_stride,
                         table, len, head, heads, group, nv, block_size, window, scale, out,
                         work);
    }
#undef SHAPES
#undef SHAPE
}
#else
static int vector_path(int kind, int group, int head_size) {
    (void)kind, (void)group, (void)head_size;
    return 0;
}
#endif

/* The version of this file's interface: the loader checks it. */
int hwplug_paged_decode_version(void) { return 4; }

/* Row i of `keys` and `values` ([rows, kv_heads, head_size] of `bytes` each) into slot
 * slots[i] of the caches; negative slots are skipped. In order, on the calling thread:
 * a few kilobytes a step, and a slot given twice keeps its last row, as the reference
 * write does. */
static void store_rows(const void *keys, const void *values, const int64_t *slots,
                       int64_t rows, void *key_cache, void *value_cache, int bytes,
                       int64_t block_stride, int64_t pos_stride, int64_t head_stride,
                       int kv_heads, int head_size, int block_size) {
    const int64_t row_bytes = (int64_t)kv_heads * head_size * bytes;
    for (int64_t i = 0; i < rows; i++) {
        const int64_t slot = slots[i];
        if (slot < 0) continue;
        const int64_t at = (slot / block_size) * block_stride + (slot % block_size) * pos_stride;
        const char *k = (const char *)keys + i * row_bytes;
        const char *v = (const char *)values + i * row_bytes;
        for (int h = 0; h < kv_heads; h++) {
            const int64_t to = (at + (int64_t)h * head_stride) * bytes;
            const int64_t from = (int64_t)h * head_size * bytes;
            memcpy((char *)key_cache + to, k + from, (size_t)head_size * bytes);
            memcpy((char *)value_cache + to, v + from, (size_t)head_size * bytes);
        }
    }
}

/* Statuses of hwplug_paged_decode: 0 done; the others leave every buffer untouched and
 * say in fault[] where the first bad value is. */
enum {
    DECODE_OK = 0,
    DECODE_NO_MEMORY = 1,    /* a work buffer could not be allocated */
    DECODE_BAD_SIZES = 2,    /* fault: {which size, its value} (see check_sizes) */
    DECODE_BAD_QUERY = 3,    /* a query kind other than float32 and bfloat16 */
    DECODE_CODES_ROWS = 4,   /* new rows for a cache of fp8 codes (they need scaling) */
    DECODE_BAD_LENGTH = 5,   /* fault: {sequence, its length} */
    DECODE_BAD_BLOCK = 6,    /* fault: {sequence, table column, the block id there} */
    DECODE_BAD_SLOT = 7,     /* fault: {row, its slot} */
};

static int fail(int64_t *fault, int status, int64_t a, int64_t b, int64_t c) {
    if (fault != NULL) {
        fault[0] = a;
        fault[1] = b;
        fault[2] = c;
    }
    return status;
}

/* Sizes the kernel cannot take: which (0 n, 1 kv_heads, 2 group, 3 head_size,
 * 4 block_size, 5 num_blocks, 6 table columns, 7 window, 8 rows, 9 kind, 10 strides). */
static int check_sizes(int64_t n, int kv_heads, int group, int head_size, int block_size,
                       int64_t num_blocks, int64_t table_cols, int64_t window, int64_t rows,
                       int kind, int64_t block_stride, int64_t pos_stride, int64_t head_stride,
                       int64_t table_stride, int64_t *fault) {
    if (n < 0) return fail(fault, DECODE_BAD_SIZES, 0, n, 0);
    if (kv_heads < 1) return fail(fault, DECODE_BAD_SIZES, 1, kv_heads, 0);
    if (group < 1) return fail(fault, DECODE_BAD_SIZES, 2, group, 0);
    if (head_size < 1) return fail(fault, DECODE_BAD_SIZES, 3, head_size, 0);
    if (block_size < 1 || block_size > MAX_BLOCK) return fail(fault, DECODE_BAD_SIZES, 4, block_size, 0);
    if (num_blocks < 0) return fail(fault, DECODE_BAD_SIZES, 5, num_blocks, 0);
    if (table_cols < 0) return fail(fault, DECODE_BAD_SIZES, 6, table_cols, 0);
    if (window < 0) return fail(fault, DECODE_BAD_SIZES, 7, window, 0);
    if (rows < 0) return fail(fault, DECODE_BAD_SIZES, 8, rows, 0);
    if (kind < KIND_F32 || kind > KIND_CODES) return fail(fault, DECODE_BAD_SIZES, 9, kind, 0);
    if (block_stride < 0 || pos_stride < 0 || head_stride < 0 || table_stride < 0)
        return fail(fault, DECODE_BAD_SIZES, 10, 0, 0);
    return DECODE_OK;
}

/* Every index read from a tensor, checked against the buffer it addresses before anything
 * is read or written: each length in 1..table_cols * block_size, each block id of the
 * columns a length covers (from its window's first position on) in 0..num_blocks - 1,
 * each slot of a new row negative (padding) or below num_blocks * block_size. A few
 * integer compares a sequence: nothing beside the kernel's own page walk. */
static int check_indices(const int64_t *table, int64_t table_stride, int64_t table_cols,
                         const int64_t *lens, int64_t n, int block_size, int64_t num_blocks,
                         int64_t window, const int64_t *slots, int64_t rows, int64_t *fault) {
    const int64_t positions = table_cols * block_size;
    for (int64_t b = 0; b < n; b++) {
        const int64_t len = lens[b];
        if (len < 1 || len > positions) return fail(fault, DECODE_BAD_LENGTH, b, len, 0);
        const int64_t *row = table + b * table_stride;
        for (int64_t c = first_seen(len, window) / block_size; c <= (len - 1) / block_size; c++) {
            if (row[c] < 0 || row[c] >= num_blocks)
                return fail(fault, DECODE_BAD_BLOCK, b, c, row[c]);
        }
    }
    const int64_t slot_count = num_blocks * block_size;
    for (int64_t i = 0; i < rows; i++) {
        if (slots[i] >= slot_count) return fail(fault, DECODE_BAD_SLOT, i, slots[i], 0);
    }
    return DECODE_OK;
}

/* Returns a status of the enum above. Nothing is read or written before every size and
 * every index read from the table, the lengths and the slots has been checked. */
int hwplug_paged_decode(const void *query, int qkind, void *key_cache, void *value_cache,
                        int kind, const float *lut, int64_t block_stride, int64_t pos_stride,
                        int64_t head_stride, const int64_t *table, int64_t table_stride,
                        const int64_t *lens, int64_t n, int kv_heads, int group, int head_size,
                        int block_size, int64_t window, float scale, void *out, int threads,
                        const void *new_keys, const void *new_values, const int64_t *slots,
                        int64_t new_rows, int64_t num_blocks, int64_t table_cols,
                        int64_t *fault) {
    if (qkind != KIND_F32 && qkind != KIND_BF16) return DECODE_BAD_QUERY;
    const int64_t rows_given = new_keys != NULL ? new_rows : 0;
    int status = check_sizes(n, kv_heads, group, head_size, block_size, num_blocks, table_cols,
                             window, rows_given, kind, block_stride, pos_stride, head_stride,
                             table_stride, fault);
    if (status != DECODE_OK) return status;
    if (rows_given > 0 && kind == KIND_CODES) return DECODE_CODES_ROWS;
#if defined(HWPLUG_UNCHECKED_INDICES)
    /* benchmarks/bench_kernel_checks.py only, to measure what the checks cost: the
     * library is never built so */
    (void)check_indices;
#else
    status = check_indices(table, table_stride, table_cols, lens, n, block_size, num_blocks,
                           window, slots, rows_given, fault);
#endif
    if (status != DECODE_OK) return status;
    if (rows_given > 0) {
        store_rows(new_keys, new_values, slots, new_rows, key_cache, value_cache,
                   kind == KIND_F32 ? 4 : 2, block_stride, pos_stride, head_stride, kv_heads,
                   head_size, block_size);
    }
    /* work items: whole sequences, or parts of their heads when there are few sequences */
    int split = 1;
    while (split < kv_heads && n * split < 4 * (int64_t)threads) split *= 2;
    while (kv_heads % split != 0) split--;
    const int heads = kv_heads / split;
    const int64_t items = n * split;
    const int vector = vector_path(kind, group, head_size);
    (void)vector;
    const int rows = heads * group;
    const int64_t item_floats = (int64_t)rows * head_size; /* one item's query rows */
    /* the rows' state (rows_begin), a row of keys or values; for a bfloat16 query, the
     * item's query rows and results in float32 */
    const int64_t work_floats = item_floats + 2 * rows + (int64_t)rows * MAX_BLOCK + head_size +
                                (qkind == KIND_F32 ? 0 : 2 * item_floats);
    int failed = DECODE_OK;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) reduction(| : failed)
    {
        float *work = (float *)malloc(sizeof(float) * work_floats);
        if (work == NULL) {
            failed = DECODE_NO_MEMORY;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; item++) {
            if (work == NULL) continue;
            const int64_t b = item / split;
            const int head = (int)(item % split) * heads;
            const int64_t offset = (b * kv_heads + head) * (int64_t)group * head_size;
            const float *q = (const float *)query + offset;
            float *o = (float *)out + offset;
            if (qkind == KIND_BF16) { /* widened into the end of the work buffer */
                float *wide = work + work_floats - 2 * item_floats;
                const uint16_t *src = (const uint16_t *)query + offset;
                for (int64_t i = 0; i < item_floats; i++) wide[i] = bf16_to_f32(src[i]);
                q = wide;
                o = wide + item_floats;
            }
#if defined(HWPLUG_SIMD)
            if (vector) {
                attend_vec(q, key_cache, value_cache, kind, block_stride, pos_stride,
                           head_stride, table + b * table_stride, lens[b], head, heads, group,
                           head_size, block_size, window, scale, o, work);
            } else
#endif
            {
                attend_one(q, key_cache, value_cache, kind, lut, block_stride, pos_stride,
                           head_stride, table + b * table_stride, lens[b], head, heads, group,
                           head_size, block_size, window, scale, o, work);
            }
            if (qkind == KIND_BF16) {
                uint16_t *dst = (uint16_t *)out + offset;
                for (int64_t i = 0; i < item_floats; i++) dst[i] = f32_to_bf16(o[i]);
            }
        }
        free(work);
    }
    return failed;
}
