/*
 * bfloat16 <-> float32 for one value, shared by paged_decode.c and
 * linear_amx.c. bfloat16 is the top half of a float32: widening is exact;
 * narrowing rounds to nearest even, as torch's .to(torch.bfloat16) does,
 * and keeps a NaN a (quiet) NaN.
 */
#ifndef HWPLUG_BFLOAT16_H
#define HWPLUG_BFLOAT16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

#endif
