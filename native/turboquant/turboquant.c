#include "turboquant.h"

#include <math.h>
#include <string.h>

#include "turboquant_codebooks.h"

static const float *centroids(int bits) {
    return bits == 4 ? tq_centroids_4 : bits == 3 ? tq_centroids_3 : bits == 2 ? tq_centroids_2 : NULL;
}

static const float *thresholds(int bits) {
    return bits == 4 ? tq_thresholds_4 : bits == 3 ? tq_thresholds_3 : bits == 2 ? tq_thresholds_2 : NULL;
}

size_t tq_block_bytes(int bits) {
    return (bits >= 2 && bits <= 4) ? 2 + (size_t)TQ_BLOCK * (size_t)bits / 8 : 0;
}

size_t tq_row_bytes(int bits, int64_t n) {
    if (n < 0 || n % TQ_BLOCK != 0) {
        return 0;
    }
    return (size_t)(n / TQ_BLOCK) * tq_block_bytes(bits);
}

uint16_t tq_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) { /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (abs < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (abs < 0x33000000u) {
            return (uint16_t)sign;
        }
        const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const int shift = 126 - (int)(abs >> 23); /* 14..24 */
        uint32_t half = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        const uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) {
            half++;
        }
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((abs - 0x38000000u) >> 13); /* rebias exponent 127 -> 15 */
    const uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) {
        half++;
    }
    return (uint16_t)(sign | half);
}

float tq_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else { /* subnormal: normalise */
            exp = 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ffu;
            x = sign | ((exp + 112u) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

int tq_quantize_row(int bits, const float *x, void *dst, int64_t n) {
    const float *th = thresholds(bits);
    const size_t bb = tq_block_bytes(bits);
    if (!th || n < 0 || n % TQ_BLOCK != 0) {
        return -1;
    }
    const int levels = 1 << bits;
    uint8_t *out = (uint8_t *)dst;
    for (int64_t b = 0; b < n / TQ_BLOCK; b++) {
        const float *v = x + b * TQ_BLOCK;
        uint8_t *blk = out + (size_t)b * bb;
        double ss = 0.0;
        for (int i = 0; i < TQ_BLOCK; i++) {
            const double d = (double)v[i];
            const double sq = d * d;
            ss += sq;
        }
        float norm = (float)sqrt(ss);
        if (norm > 65504.0f) {
            norm = 65504.0f;
        }
        const uint16_t h = tq_fp32_to_fp16(norm);
        blk[0] = (uint8_t)(h & 0xffu);
        blk[1] = (uint8_t)(h >> 8);
        const float n32 = tq_fp16_to_fp32(h);
        const float inv = n32 > 0.0f ? 8.0f / n32 : 0.0f;
        uint8_t *q = blk + 2;
        memset(q, 0, bb - 2);
        for (int i = 0; i < TQ_BLOCK; i++) {
            const float y = v[i] * inv;
            int idx = 0;
            while (idx < levels - 1 && th[idx] < y) {
                idx++;
            }
            const int bit = i * bits;
            q[bit >> 3] |= (uint8_t)(idx << (bit & 7));
            if ((bit & 7) + bits > 8) {
                q[(bit >> 3) + 1] |= (uint8_t)(idx >> (8 - (bit & 7)));
            }
        }
    }
    return 0;
}

int tq_dequantize_row(int bits, const void *src, float *y, int64_t n) {
    const float *c = centroids(bits);
    const size_t bb = tq_block_bytes(bits);
    if (!c || n < 0 || n % TQ_BLOCK != 0) {
        return -1;
    }
    const uint8_t *in = (const uint8_t *)src;
    const unsigned mask = (1u << bits) - 1u;
    for (int64_t b = 0; b < n / TQ_BLOCK; b++) {
        const uint8_t *blk = in + (size_t)b * bb;
        const float scale = tq_fp16_to_fp32((uint16_t)(blk[0] | (blk[1] << 8))) * 0.125f;
        const uint8_t *q = blk + 2;
        for (int i = 0; i < TQ_BLOCK; i++) {
            const int bit = i * bits;
            unsigned v = q[bit >> 3] >> (bit & 7);
            if ((bit & 7) + bits > 8) {
                v |= (unsigned)q[(bit >> 3) + 1] << (8 - (bit & 7));
            }
            y[b * TQ_BLOCK + i] = c[v & mask] * scale;
        }
    }
    return 0;
}
