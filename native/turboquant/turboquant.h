/*
 * TurboQuant-MSE codec (C), bit for bit the reference of appliance/kv/turboquant.py, whose
 * docstring defines the block layout.
 *
 * One block holds TQ_BLOCK (64) values: an fp16 L2 norm, 4-bit gain codes (one per sub-block)
 * and 64 codebook indices. Bytes per block and bits per value: turbo4 35 (4.375),
 * turbo3 28 (3.5), turbo2 20 (2.5).
 * Quantize and dequantize give the same bytes and floats with or without SIMD (AVX2 where the
 * CPU has it, NEON on AArch64); tq_vec_dot_f32 is a plain float dot product (FMA, different summation order).
 * Build with -ffp-contract=off: fused multiply-adds would change the codec's results.
 */
#ifndef TURBOQUANT_H
#define TURBOQUANT_H

#include <stddef.h>
#include <stdint.h>

#define TQ_TURBO4_BYTES 35
#define TQ_TURBO3_BYTES 28
#define TQ_TURBO2_BYTES 20

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one block for 2, 3 or 4 bits per index; 0 for other values. */
size_t tq_block_bytes(int bits);

/* Bytes of a row of n values (n a multiple of 64); 0 when n or bits is invalid. */
size_t tq_row_bytes(int bits, int64_t n);

/* Quantize n floats into dst (tq_row_bytes(bits, n) bytes). Returns 0, or -1 on bad arguments. */
int tq_quantize_row(int bits, const float *x, void *dst, int64_t n);

/* Decode n values from src into y. Returns 0, or -1 on bad arguments. */
int tq_dequantize_row(int bits, const void *src, float *y, int64_t n);

/* Sum over the row of decoded(x)[i] * y[i]; 0 on bad arguments. */
float tq_vec_dot_f32(int bits, const void *x, const float *y, int64_t n);

/* Turn the SIMD paths off (0) or back on where the CPU has them (1); returns the previous state.
 * For tests that compare both paths. */
int tq_set_simd(int enabled);

/* IEEE fp16 conversions (round to nearest even), exposed for the tests. */
uint16_t tq_fp32_to_fp16(float f);
float tq_fp16_to_fp32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif
