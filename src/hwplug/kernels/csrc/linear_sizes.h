/*
 * The sizes and row strides a linear kernel takes for y[M, N] = x[M, K] . w[N, K]^T:
 * none negative, and y's rows apart (writing one row never overwrites another).
 * Python checks them first (hwplug.kernels.checks); this is the kernels' own guard, so
 * that no caller reaches a write outside y through them. Status 3 when they fail.
 */
#ifndef HWPLUG_LINEAR_SIZES_H
#define HWPLUG_LINEAR_SIZES_H

#include <stdint.h>

enum { LINEAR_BAD_SIZES = 3 };

static inline int linear_sizes_ok(int64_t M, int64_t K, int64_t ldx, int64_t N, int64_t ldw,
                                  int64_t ldy) {
    return M >= 0 && K >= 0 && N >= 0 && ldx >= 0 && ldw >= 0 && ldy >= 0 &&
           (M <= 1 || ldy >= N);
}

#endif
