/* What simd_check.c and the codec need from a C library, for the AArch64 build that the Unicorn
 * emulator runs (tests/unit/kv/aarch64_user.py): linked with -nostdlib, so that Zig does not
 * build all of musl for the target first (about 80 s on 2 cores at every run of a fresh machine). */
#include <stddef.h>

int main(void);

static long syscall3(long nr, long a, long b, long c) {
    register long x8 __asm__("x8") = nr;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
    return x0;
}

long write(int fd, const void *buf, unsigned long n) { return syscall3(64, fd, (long)buf, (long)n); }

void *memset(void *dst, int c, size_t n) {
    volatile unsigned char *d = dst; /* volatile: not turned back into a call to memset */
    while (n--) *d++ = (unsigned char)c;
    return dst;
}

void *memcpy(void *dst, const void *src, size_t n) {
    volatile unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--) *d++ = *s++;
    return dst;
}

int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++) {
        if (*x != *y) return *x - *y;
    }
    return 0;
}

int bcmp(const void *a, const void *b, size_t n) { return memcmp(a, b, n); } /* clang's memcmp(...) != 0 */

size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

double sqrt(double x) { return __builtin_sqrt(x); } /* one instruction (fsqrt) with -fno-math-errno */

void _start(void) {
    syscall3(93, main(), 0, 0); /* exit */
    for (;;) {
    }
}
