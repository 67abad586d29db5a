/* Compares the codec's SIMD paths (AVX2 on x86, NEON on AArch64) with its scalar path on
 * generated rows, and prints a digest of the scalar results so that builds for different
 * machines can be compared with each other. Exit status: the number of mismatches (max 255). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "turboquant.h"

#define N 256
#define ROWS 48

static uint64_t state = 0x9e3779b97f4a7c15ull;

static double uniform(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return ((double)(state >> 11) + 0.5) / 9007199254740992.0;
}

static void make_row(int kind, float *x) {
    for (int i = 0; i < N; i++) {
        const double g = sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
        switch (kind % 4) {
        case 0: x[i] = (float)g; break;                                  /* Gaussian */
        case 1: x[i] = (float)(g * g * g * 3.0); break;                  /* heavy tails */
        case 2: x[i] = (i % 64 < 8) ? 0.0f : (float)(g * 1e-6); break;  /* zeros and tiny values */
        default: x[i] = (float)(g * 40.0 + (i == 5 ? 900.0 : 0.0)); break; /* one outlier */
        }
    }
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ b[i]) * 0x100000001b3ull;
    }
    return h;
}

int main(void) {
    static float x[N], y[N], ds[N], dv[N];
    static uint8_t qs[N * 2], qv[N * 2];
    int bad = 0;
    const int simd = tq_set_simd(1) | tq_set_simd(1);
    for (int bits = 2; bits <= 4; bits++) {
        uint64_t digest = 0xcbf29ce484222325ull;
        const size_t bytes = tq_row_bytes(bits, N);
        for (int r = 0; r < ROWS; r++) {
            make_row(r, x);
            make_row(r + 1, y);
            tq_set_simd(0);
            memset(qs, 0, sizeof qs);
            tq_quantize_row(bits, x, qs, N);
            tq_dequantize_row(bits, qs, ds, N);
            const float dot_s = tq_vec_dot_f32(bits, qs, y, N);
            tq_set_simd(1);
            memset(qv, 0, sizeof qv);
            tq_quantize_row(bits, x, qv, N);
            tq_dequantize_row(bits, qs, dv, N);
            const float dot_v = tq_vec_dot_f32(bits, qs, y, N);
            double mag = 0.0;
            for (int i = 0; i < N; i++) {
                mag += fabs((double)ds[i] * (double)y[i]);
            }
            if (memcmp(qs, qv, bytes) != 0) {
                printf("turbo%d row %d: quantized bytes differ\n", bits, r);
                bad++;
            }
            if (memcmp(ds, dv, sizeof ds) != 0) {
                printf("turbo%d row %d: decoded values differ\n", bits, r);
                bad++;
            }
            if (fabs((double)dot_s - (double)dot_v) > 1e-5 * mag + 1e-30) {
                printf("turbo%d row %d: dot %.9g vs %.9g\n", bits, r, dot_s, dot_v);
                bad++;
            }
            digest = fnv(digest, qs, bytes);
            digest = fnv(digest, ds, sizeof ds);
        }
        printf("turbo%d digest %016llx\n", bits, (unsigned long long)digest);
    }
    printf("simd %d mismatches %d\n", simd, bad);
    return bad > 255 ? 255 : bad;
}
