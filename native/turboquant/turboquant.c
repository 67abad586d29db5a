#include "turboquant.h"

#include <math.h>
#include <string.h>

#include "turboquant_codebooks.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TQ_X86 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define TQ_NEON 1
#endif

#define TQ_GAINS 16

typedef struct {
    int bits;
    int levels;
    int sub;    /* values per sub-block */
    int nsub;   /* sub-blocks per block */
    int ncode;  /* bytes of gain codes */
    int bytes;  /* bytes per block */
    const float *c;
    const float *t;
} tq_mode;

static int mode_of(int bits, tq_mode *m) {
    switch (bits) {
    case 4: m->sub = TQ_SUB_BLOCK_4; m->c = tq_centroids_4; m->t = tq_thresholds_4; break;
    case 3: m->sub = TQ_SUB_BLOCK_3; m->c = tq_centroids_3; m->t = tq_thresholds_3; break;
    case 2: m->sub = TQ_SUB_BLOCK_2; m->c = tq_centroids_2; m->t = tq_thresholds_2; break;
    default: return 0;
    }
    m->bits = bits;
    m->levels = 1 << bits;
    m->nsub = TQ_BLOCK / m->sub;
    m->ncode = (m->nsub + 1) / 2;
    m->bytes = 2 + m->ncode + TQ_BLOCK * bits / 8;
    return 1;
}

static int tq_simd = -1; /* -1: detect on first use */

static int simd_enabled(void) {
    if (tq_simd < 0) {
#if TQ_X86
        __builtin_cpu_init();
        tq_simd = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#elif TQ_NEON
        tq_simd = 1; /* every AArch64 CPU has NEON */
#else
        tq_simd = 0;
#endif
    }
    return tq_simd;
}

int tq_set_simd(int enabled) {
    const int previous = simd_enabled();
    tq_simd = enabled ? -1 : 0;
    simd_enabled();
    return previous;
}

size_t tq_block_bytes(int bits) {
    tq_mode m;
    return mode_of(bits, &m) ? (size_t)m.bytes : 0;
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

/* ---- index layout (see turboquant.h) ---- */

static void put_index(uint8_t *q, int bits, int i, unsigned idx) {
    if (bits == 4) {
        q[i & 31] |= (uint8_t)(idx << ((i >> 5) * 4));
        return;
    }
    q[i & 15] |= (uint8_t)((idx & 3u) << ((i >> 4) * 2));
    if (bits == 3) {
        q[16 + (i & 7)] |= (uint8_t)(((idx >> 2) & 1u) << (i >> 3));
    }
}

static unsigned get_index(const uint8_t *q, int bits, int i) {
    if (bits == 4) {
        return (q[i & 31] >> ((i >> 5) * 4)) & 15u;
    }
    unsigned v = (q[i & 15] >> ((i >> 4) * 2)) & 3u;
    if (bits == 3) {
        v |= ((q[16 + (i & 7)] >> (i >> 3)) & 1u) << 2;
    }
    return v;
}

static unsigned index_of(const tq_mode *m, float y) {
    unsigned idx = 0;
    while ((int)idx < m->levels - 1 && m->t[idx] < y) {
        idx++;
    }
    return idx;
}

/* ---- encoder: squared error of a sub-block under each of the 16 gains ---- */

static void sub_errors_scalar(const tq_mode *m, const float *x, const float *scale, const float *inv, double *err) {
    for (int k = 0; k < TQ_GAINS; k++) {
        err[k] = 0.0;
    }
    for (int i = 0; i < m->sub; i++) {
        for (int k = 0; k < TQ_GAINS; k++) {
            const float r = m->c[index_of(m, x[i] * inv[k])] * scale[k];
            const double d = (double)x[i] - (double)r;
            const double sq = d * d;
            err[k] += sq;
        }
    }
}

#if TQ_X86
/* Same arithmetic as sub_errors_scalar, the 16 gains in lanes: each lane sums its own error in
 * value order, so the results are identical. */
__attribute__((target("avx2"))) static void sub_errors_avx2(const tq_mode *m, const float *x, const float *scale,
                                                             const float *inv, double *err) {
    const __m256 inv0 = _mm256_loadu_ps(inv), inv1 = _mm256_loadu_ps(inv + 8);
    const __m256 sc0 = _mm256_loadu_ps(scale), sc1 = _mm256_loadu_ps(scale + 8);
    const __m256 clo = _mm256_loadu_ps(m->c);
    const __m256 chi = m->levels == 16 ? _mm256_loadu_ps(m->c + 8) : clo;
    const __m256i seven = _mm256_set1_epi32(7);
    __m256d e[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    for (int i = 0; i < m->sub; i++) {
        const __m256 xv = _mm256_set1_ps(x[i]);
        const __m256d xd = _mm256_set1_pd((double)x[i]);
        const __m256 y[2] = {_mm256_mul_ps(xv, inv0), _mm256_mul_ps(xv, inv1)};
        const __m256 sc[2] = {sc0, sc1};
        for (int h = 0; h < 2; h++) {
            __m256i cnt = _mm256_setzero_si256();
            for (int j = 0; j < m->levels - 1; j++) {
                const __m256 lt = _mm256_cmp_ps(_mm256_set1_ps(m->t[j]), y[h], _CMP_LT_OQ);
                cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(lt));
            }
            __m256 cv = _mm256_permutevar8x32_ps(clo, cnt);
            if (m->levels == 16) {
                const __m256 hi = _mm256_permutevar8x32_ps(chi, cnt);
                cv = _mm256_blendv_ps(cv, hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(cnt, seven)));
            }
            const __m256 r = _mm256_mul_ps(cv, sc[h]);
            const __m256d d0 = _mm256_sub_pd(xd, _mm256_cvtps_pd(_mm256_castps256_ps128(r)));
            const __m256d d1 = _mm256_sub_pd(xd, _mm256_cvtps_pd(_mm256_extractf128_ps(r, 1)));
            e[2 * h] = _mm256_add_pd(e[2 * h], _mm256_mul_pd(d0, d0));
            e[2 * h + 1] = _mm256_add_pd(e[2 * h + 1], _mm256_mul_pd(d1, d1));
        }
    }
    for (int q = 0; q < 4; q++) {
        _mm256_storeu_pd(err + 4 * q, e[q]);
    }
}
#endif

#if TQ_NEON
/* The codebook as 64 bytes, so that vqtbl4q_u8 gathers 4 centroids by index (a float gather). */
static inline uint8x16x4_t centroid_table_neon(const tq_mode *m) {
    float c[16] = {0};
    memcpy(c, m->c, (size_t)m->levels * sizeof(float));
    uint8x16x4_t t;
    for (int k = 0; k < 4; k++) {
        t.val[k] = vld1q_u8((const uint8_t *)(c + 4 * k));
    }
    return t;
}

static inline float32x4_t gather4_neon(uint8x16x4_t table, uint32x4_t idx) {
    /* byte b of lane i reads table byte 4*idx[i] + b (little-endian float) */
    const uint32x4_t bytes = vmlaq_n_u32(vdupq_n_u32(0x03020100u), idx, 0x04040404u);
    return vreinterpretq_f32_u8(vqtbl4q_u8(table, vreinterpretq_u8_u32(bytes)));
}

/* Same arithmetic as sub_errors_scalar, the 16 gains in 4 registers; identical results. */
static void sub_errors_neon(const tq_mode *m, const float *x, const float *scale, const float *inv, double *err) {
    const uint8x16x4_t table = centroid_table_neon(m);
    float32x4_t iv[4], sc[4];
    float64x2_t e[8];
    for (int h = 0; h < 4; h++) {
        iv[h] = vld1q_f32(inv + 4 * h);
        sc[h] = vld1q_f32(scale + 4 * h);
        e[2 * h] = e[2 * h + 1] = vdupq_n_f64(0.0);
    }
    for (int i = 0; i < m->sub; i++) {
        const float32x4_t xv = vdupq_n_f32(x[i]);
        const float64x2_t xd = vdupq_n_f64((double)x[i]);
        for (int h = 0; h < 4; h++) {
            const float32x4_t y = vmulq_f32(xv, iv[h]);
            uint32x4_t cnt = vdupq_n_u32(0);
            for (int j = 0; j < m->levels - 1; j++) {
                cnt = vsubq_u32(cnt, vcltq_f32(vdupq_n_f32(m->t[j]), y)); /* true is all ones: -1 */
            }
            const float32x4_t r = vmulq_f32(gather4_neon(table, cnt), sc[h]);
            const float64x2_t d0 = vsubq_f64(xd, vcvt_f64_f32(vget_low_f32(r)));
            const float64x2_t d1 = vsubq_f64(xd, vcvt_high_f64_f32(r));
            e[2 * h] = vaddq_f64(e[2 * h], vmulq_f64(d0, d0));
            e[2 * h + 1] = vaddq_f64(e[2 * h + 1], vmulq_f64(d1, d1));
        }
    }
    for (int q = 0; q < 8; q++) {
        vst1q_f64(err + 2 * q, e[q]);
    }
}
#endif

int tq_quantize_row(int bits, const float *x, void *dst, int64_t n) {
    tq_mode m;
    if (!mode_of(bits, &m) || n < 0 || n % TQ_BLOCK != 0) {
        return -1;
    }
    const int simd = simd_enabled();
    uint8_t *out = (uint8_t *)dst;
    for (int64_t b = 0; b < n / TQ_BLOCK; b++) {
        const float *v = x + b * TQ_BLOCK;
        uint8_t *blk = out + (size_t)b * (size_t)m.bytes;
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
        memset(blk, 0, (size_t)m.bytes);
        blk[0] = (uint8_t)(h & 0xffu);
        blk[1] = (uint8_t)(h >> 8);
        const float base = tq_fp16_to_fp32(h) * 0.125f;
        float scale[TQ_GAINS], inv[TQ_GAINS];
        for (int k = 0; k < TQ_GAINS; k++) {
            scale[k] = base * tq_gains[k];
            inv[k] = scale[k] > 0.0f ? 1.0f / scale[k] : 0.0f;
        }
        uint8_t *codes = blk + 2;
        uint8_t *q = blk + 2 + m.ncode;
        for (int s = 0; s < m.nsub; s++) {
            const float *xs = v + s * m.sub;
            double err[TQ_GAINS];
#if TQ_X86
            if (simd) {
                sub_errors_avx2(&m, xs, scale, inv, err);
            } else
#elif TQ_NEON
            if (simd) {
                sub_errors_neon(&m, xs, scale, inv, err);
            } else
#endif
            {
                (void)simd;
                sub_errors_scalar(&m, xs, scale, inv, err);
            }
            int best = 0;
            for (int k = 1; k < TQ_GAINS; k++) {
                if (err[k] < err[best]) {
                    best = k;
                }
            }
            codes[s >> 1] |= (uint8_t)(best << ((s & 1) * 4));
            for (int i = 0; i < m.sub; i++) {
                put_index(q, bits, s * m.sub + i, index_of(&m, xs[i] * inv[best]));
            }
        }
    }
    return 0;
}

/* ---- decoder ---- */

static void block_scales(const tq_mode *m, const uint8_t *blk, float *scale) {
    const float base = tq_fp16_to_fp32((uint16_t)(blk[0] | (blk[1] << 8))) * 0.125f;
    for (int s = 0; s < m->nsub; s++) {
        scale[s] = base * tq_gains[(blk[2 + (s >> 1)] >> ((s & 1) * 4)) & 15u];
    }
}

/* The 64 indices of a block, in value order. */
static void block_indices(const tq_mode *m, const uint8_t *q, uint8_t *idx) {
    for (int i = 0; i < TQ_BLOCK; i++) {
        idx[i] = (uint8_t)get_index(q, m->bits, i);
    }
}

static void dequantize_scalar(const tq_mode *m_, const uint8_t *src, float *y, int64_t n) {
    const tq_mode m = *m_;
    const uint8_t *in = (const uint8_t *)src;
    for (int64_t b = 0; b < n / TQ_BLOCK; b++) {
        const uint8_t *blk = in + (size_t)b * (size_t)m.bytes;
        float scale[4];
        uint8_t idx[TQ_BLOCK];
        block_scales(&m, blk, scale);
        block_indices(&m, blk + 2 + m.ncode, idx);
        float *out = y + b * TQ_BLOCK;
        for (int i = 0; i < TQ_BLOCK; i++) {
            out[i] = m.c[idx[i]] * scale[i / m.sub];
        }
    }
}

/* ---- dot product of a TurboQuant row with float32 values (flash-attention K·Q) ---- */

static float vec_dot_scalar(const tq_mode *m, const uint8_t *in, const float *y, int64_t n) {
    double total = 0.0;
    for (int64_t b = 0; b < n / TQ_BLOCK; b++) {
        const uint8_t *blk = in + (size_t)b * (size_t)m->bytes;
        float scale[4];
        uint8_t idx[TQ_BLOCK];
        block_scales(m, blk, scale);
        block_indices(m, blk + 2 + m->ncode, idx);
        const float *yb = y + b * TQ_BLOCK;
        for (int s = 0; s < m->nsub; s++) {
            float acc = 0.0f;
            for (int i = s * m->sub; i < (s + 1) * m->sub; i++) {
                acc += m->c[idx[i]] * yb[i];
            }
            total += (double)(acc * scale[s]);
        }
    }
    return (float)total;
}

#if TQ_X86
/* 8 centroids for 8 indices held in the low bytes of `bytes` (one index per byte). */
__attribute__((target("avx2"), always_inline)) static inline __m256 lookup8(const tq_mode *m, __m128i bytes, __m256 clo, __m256 chi) {
    const __m256i idx = _mm256_cvtepu8_epi32(bytes);
    __m256 v = _mm256_permutevar8x32_ps(clo, idx);
    if (m->levels == 16) {
        const __m256 hi = _mm256_permutevar8x32_ps(chi, idx);
        v = _mm256_blendv_ps(v, hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7))));
    }
    return v;
}

/* The 64 indices of a block as bytes in value order (two registers of 32), without going
 * through memory: variable shifts pick each value's bits out of the packed layout. */
__attribute__((target("avx2"), always_inline)) static inline void unpack_avx2(const tq_mode *m, const uint8_t *q, __m256i *lo32,
                                                               __m256i *hi32) {
    if (m->bits == 4) {
        const __m256i p = _mm256_loadu_si256((const __m256i *)q);
        *lo32 = _mm256_and_si256(p, _mm256_set1_epi8(15));
        *hi32 = _mm256_and_si256(_mm256_srli_epi16(p, 4), _mm256_set1_epi8(15));
        return;
    }
    /* 2-bit plane: byte j holds values j, j+16, j+32, j+48 at bits 0, 2, 4, 6 */
    const __m256i plane = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q));
    const __m256i three = _mm256_set1_epi8(3);
    __m256i a = _mm256_and_si256(_mm256_srlv_epi32(plane, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)), three);
    __m256i b = _mm256_and_si256(_mm256_srlv_epi32(plane, _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6)), three);
    if (m->bits == 3) {
        /* high plane: bit k of byte j is the high bit of value j + 8k */
        const __m256i hb = _mm256_set1_epi64x((long long)(*(const uint64_t *)(q + 16)));
        const __m256i one = _mm256_set1_epi8(1);
        const __m256i ha = _mm256_and_si256(_mm256_srlv_epi64(hb, _mm256_setr_epi64x(0, 1, 2, 3)), one);
        const __m256i hbv = _mm256_and_si256(_mm256_srlv_epi64(hb, _mm256_setr_epi64x(4, 5, 6, 7)), one);
        a = _mm256_or_si256(a, _mm256_slli_epi16(ha, 2));
        b = _mm256_or_si256(b, _mm256_slli_epi16(hbv, 2));
    }
    *lo32 = a;
    *hi32 = b;
}

__attribute__((target("avx2,f16c"), always_inline)) static inline void block_scales_f16c(const tq_mode *m, const uint8_t *blk,
                                                                          float *scale) {
    const float base = _cvtsh_ss((unsigned short)(blk[0] | (blk[1] << 8))) * 0.125f;
    for (int s = 0; s < m->nsub; s++) {
        scale[s] = base * tq_gains[(blk[2 + (s >> 1)] >> ((s & 1) * 4)) & 15u];
    }
}

__attribute__((target("avx2"))) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* What both the K·Q product and the decoder need of a block: its sub-block scales and its 64
 * indices as 8 chunks of 8 bytes in value order. */
typedef struct {
    float scale[4];
    __m128i ch[8];
} tq_block_avx2;

__attribute__((target("avx2,f16c"), always_inline)) static inline void load_block_avx2(const tq_mode *m, const uint8_t *blk,
                                                                        tq_block_avx2 *out) {
    __m256i lo, hi;
    block_scales_f16c(m, blk, out->scale);
    unpack_avx2(m, blk + 2 + m->ncode, &lo, &hi);
    const __m128i l0 = _mm256_castsi256_si128(lo), l1 = _mm256_extracti128_si256(lo, 1);
    const __m128i h0 = _mm256_castsi256_si128(hi), h1 = _mm256_extracti128_si256(hi, 1);
    out->ch[0] = l0; out->ch[1] = _mm_srli_si128(l0, 8); out->ch[2] = l1; out->ch[3] = _mm_srli_si128(l1, 8);
    out->ch[4] = h0; out->ch[5] = _mm_srli_si128(h0, 8); out->ch[6] = h1; out->ch[7] = _mm_srli_si128(h1, 8);
}

/* Chunks of 8 values per sub-block scale. */
static inline int chunks_per_sub(int bits) {
    return (bits == 4 ? TQ_SUB_BLOCK_4 : bits == 3 ? TQ_SUB_BLOCK_3 : TQ_SUB_BLOCK_2) / 8;
}

/* Specialised per mode (bits a constant after inlining) so the loops unroll fully. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline float vec_dot_avx2_bits(
    const tq_mode *m, const int bits, const uint8_t *in, const float *y, int64_t n) {
    const __m256 clo = _mm256_loadu_ps(m->c);
    const __m256 chi = bits == 4 ? _mm256_loadu_ps(m->c + 8) : clo;
    const int per_sub = chunks_per_sub(bits);
    __m256 total = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / TQ_BLOCK; b++) {
        tq_block_avx2 blk;
        load_block_avx2(m, in + (size_t)b * (size_t)m->bytes, &blk);
        const float *yb = y + b * TQ_BLOCK;
        for (int s = 0; s < 8 / per_sub; s++) {
            __m256 acc = _mm256_setzero_ps();
            for (int c = s * per_sub; c < (s + 1) * per_sub; c++) {
                acc = _mm256_fmadd_ps(lookup8(m, blk.ch[c], clo, chi), _mm256_loadu_ps(yb + 8 * c), acc);
            }
            total = _mm256_fmadd_ps(acc, _mm256_set1_ps(blk.scale[s]), total);
        }
    }
    return hsum8(total);
}

__attribute__((target("avx2,fma,f16c"))) static float vec_dot_avx2(const tq_mode *m, const uint8_t *in,
                                                                    const float *y, int64_t n) {
    switch (m->bits) {
    case 4: return vec_dot_avx2_bits(m, 4, in, y, n);
    case 3: return vec_dot_avx2_bits(m, 3, in, y, n);
    default: return vec_dot_avx2_bits(m, 2, in, y, n);
    }
}

/* Bit-exact with the scalar decoder: each value is one float32 product. */
__attribute__((target("avx2,f16c"), always_inline)) static inline void dequantize_avx2_bits(
    const tq_mode *m, const int bits, const uint8_t *in, float *y, int64_t n) {
    const __m256 clo = _mm256_loadu_ps(m->c);
    const __m256 chi = bits == 4 ? _mm256_loadu_ps(m->c + 8) : clo;
    const int per_sub = chunks_per_sub(bits);
    for (int64_t b = 0; b < n / TQ_BLOCK; b++) {
        tq_block_avx2 blk;
        load_block_avx2(m, in + (size_t)b * (size_t)m->bytes, &blk);
        float *out = y + b * TQ_BLOCK;
        for (int c = 0; c < 8; c++) {
            _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(lookup8(m, blk.ch[c], clo, chi), _mm256_set1_ps(blk.scale[c / per_sub])));
        }
    }
}

__attribute__((target("avx2,f16c"))) static void dequantize_avx2(const tq_mode *m, const uint8_t *in, float *y,
                                                                   int64_t n) {
    switch (m->bits) {
    case 4: dequantize_avx2_bits(m, 4, in, y, n); break;
    case 3: dequantize_avx2_bits(m, 3, in, y, n); break;
    default: dequantize_avx2_bits(m, 2, in, y, n); break;
    }
}
#endif

#if TQ_NEON
/* The 64 indices of a block as 4 registers of 16 bytes, in value order. */
static inline void unpack_neon(int bits, const uint8_t *q, uint8x16_t g[4]) {
    if (bits == 4) {
        const uint8x16_t p0 = vld1q_u8(q), p1 = vld1q_u8(q + 16), low = vdupq_n_u8(15);
        g[0] = vandq_u8(p0, low);
        g[1] = vandq_u8(p1, low);
        g[2] = vshrq_n_u8(p0, 4);
        g[3] = vshrq_n_u8(p1, 4);
        return;
    }
    /* 2-bit plane: byte j holds values j, j+16, j+32, j+48 at bits 0, 2, 4, 6 */
    const uint8x16_t plane = vld1q_u8(q), three = vdupq_n_u8(3);
    g[0] = vandq_u8(plane, three);
    g[1] = vandq_u8(vshrq_n_u8(plane, 2), three);
    g[2] = vandq_u8(vshrq_n_u8(plane, 4), three);
    g[3] = vshrq_n_u8(plane, 6);
    if (bits == 3) {
        /* high plane: bit k of byte j is the high bit of value j + 8k; value 16*G + j is in
         * byte j & 7 at bit 2G + (j >> 3) */
        const uint8x8_t hb = vld1_u8(q + 16);
        const uint8x16_t both = vcombine_u8(hb, hb), one = vdupq_n_u8(1);
        for (int G = 0; G < 4; G++) {
            const int8x16_t shift = vcombine_s8(vdup_n_s8((int8_t)(-2 * G)), vdup_n_s8((int8_t)(-2 * G - 1)));
            const uint8x16_t high = vandq_u8(vshlq_u8(both, shift), one);
            g[G] = vorrq_u8(g[G], vshlq_n_u8(high, 2));
        }
    }
}

/* Indices 4q .. 4q+3 of a 16-index register as 32-bit lanes. */
static inline uint32x4_t widen4_neon(uint8x16_t g, int q) {
    const uint16x8_t h = q < 2 ? vmovl_u8(vget_low_u8(g)) : vmovl_high_u8(g);
    return (q & 1) ? vmovl_high_u16(h) : vmovl_u16(vget_low_u16(h));
}

/* What the decoder and the K·Q product need of a block: its 64 centroids (unscaled, in value
 * order, 4 per register) and the scale of each group of 16 values. */
static inline void load_block_neon(const tq_mode *m, uint8x16x4_t table, const uint8_t *blk, float32x4_t c[16],
                                   float32x4_t group_scale[4]) {
    float scale[4];
    uint8x16_t g[4];
    block_scales(m, blk, scale);
    unpack_neon(m->bits, blk + 2 + m->ncode, g);
    for (int G = 0; G < 4; G++) {
        group_scale[G] = vdupq_n_f32(scale[G * 16 / m->sub]);
        for (int q = 0; q < 4; q++) {
            c[4 * G + q] = gather4_neon(table, widen4_neon(g[G], q));
        }
    }
}

/* Bit-exact with the scalar decoder: each value is one float32 product. */
static void dequantize_neon(const tq_mode *m, const uint8_t *in, float *y, int64_t n) {
    const uint8x16x4_t table = centroid_table_neon(m);
    for (int64_t b = 0; b < n / TQ_BLOCK; b++) {
        float32x4_t c[16], s[4];
        load_block_neon(m, table, in + (size_t)b * (size_t)m->bytes, c, s);
        float *out = y + b * TQ_BLOCK;
        for (int i = 0; i < 16; i++) {
            vst1q_f32(out + 4 * i, vmulq_f32(c[i], s[i / 4]));
        }
    }
}

static float vec_dot_neon(const tq_mode *m, const uint8_t *in, const float *y, int64_t n) {
    const uint8x16x4_t table = centroid_table_neon(m);
    float32x4_t total = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / TQ_BLOCK; b++) {
        float32x4_t c[16], s[4];
        load_block_neon(m, table, in + (size_t)b * (size_t)m->bytes, c, s);
        const float *yb = y + b * TQ_BLOCK;
        for (int G = 0; G < 4; G++) {
            float32x4_t acc = vdupq_n_f32(0.0f);
            for (int q = 0; q < 4; q++) {
                acc = vfmaq_f32(acc, c[4 * G + q], vld1q_f32(yb + 16 * G + 4 * q));
            }
            total = vfmaq_f32(total, acc, s[G]);
        }
    }
    return vaddvq_f32(total);
}
#endif

int tq_dequantize_row(int bits, const void *src, float *y, int64_t n) {
    tq_mode m;
    if (!mode_of(bits, &m) || n < 0 || n % TQ_BLOCK != 0) {
        return -1;
    }
#if TQ_X86
    if (simd_enabled()) {
        dequantize_avx2(&m, (const uint8_t *)src, y, n);
        return 0;
    }
#elif TQ_NEON
    if (simd_enabled()) {
        dequantize_neon(&m, (const uint8_t *)src, y, n);
        return 0;
    }
#endif
    dequantize_scalar(&m, (const uint8_t *)src, y, n);
    return 0;
}

float tq_vec_dot_f32(int bits, const void *x, const float *y, int64_t n) {
    tq_mode m;
    if (!mode_of(bits, &m) || n < 0 || n % TQ_BLOCK != 0) {
        return 0.0f;
    }
#if TQ_X86
    if (simd_enabled()) {
        return vec_dot_avx2(&m, (const uint8_t *)x, y, n);
    }
#elif TQ_NEON
    if (simd_enabled()) {
        return vec_dot_neon(&m, (const uint8_t *)x, y, n);
    }
#endif
    return vec_dot_scalar(&m, (const uint8_t *)x, y, n);
}
