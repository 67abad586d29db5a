/* Compares the codec's SIMD paths (AVX2 on x86, NEON on AArch64) with its scalar path on
 * generated rows, and prints a digest of the scalar results so that builds for different
 * machines can be compared with each other. Exit status: the number of mismatches (max 255).
 * It needs nothing of a C library but write, memset and memcmp (the AArch64 build is linked
 * without one: freestanding_aarch64.c). */
#include <stdint.h>
#include <string.h>

#include "turboquant.h"

long write(int fd, const void *buf, unsigned long n);

static void say(const char *s) { write(1, s, strlen(s)); }

static void say_int(int v) {
    char buf[12];
    int i = sizeof buf;
    unsigned u = v < 0 ? -(unsigned)v : (unsigned)v;
    do {
        buf[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) buf[--i] = '-';
    write(1, buf + i, sizeof buf - i);
}

static void say_hex(uint64_t v, int digits) {
    char buf[16];
    for (int i = digits - 1; i >= 0; i--, v >>= 4) buf[i] = "0123456789abcdef"[v & 15];
    write(1, buf, digits);
}

static double absd(double x) { return x < 0 ? -x : x; }

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
        double g = -6.0; /* about N(0, 1): the sum of 12 uniforms (no libm in the AArch64 build) */
        for (int k = 0; k < 12; k++) g += uniform();
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
                mag += absd((double)ds[i] * (double)y[i]);
            }
            if (memcmp(qs, qv, bytes) != 0) {
                say("turbo"), say_int(bits), say(" row "), say_int(r), say(": quantized bytes differ\n");
                bad++;
            }
            if (memcmp(ds, dv, sizeof ds) != 0) {
                say("turbo"), say_int(bits), say(" row "), say_int(r), say(": decoded values differ\n");
                bad++;
            }
            if (absd((double)dot_s - (double)dot_v) > 1e-5 * mag + 1e-30) {
                union { float f; uint32_t u; } s = {dot_s}, v = {dot_v};
                say("turbo"), say_int(bits), say(" row "), say_int(r), say(": dot (bits) ");
                say_hex(s.u, 8), say(" vs "), say_hex(v.u, 8), say("\n");
                bad++;
            }
            digest = fnv(digest, qs, bytes);
            digest = fnv(digest, ds, sizeof ds);
        }
        say("turbo"), say_int(bits), say(" digest "), say_hex(digest, 16), say("\n");
    }
    say("simd "), say_int(simd), say(" mismatches "), say_int(bad), say("\n");
    return bad > 255 ? 255 : bad;
}
