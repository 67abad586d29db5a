/*
 * TurboQuant-MSE codec (C), bit for bit the reference of appliance/kv/turboquant.py.
 *
 * One block holds TQ_BLOCK (64) values: an fp16 L2 norm (little-endian) and 64 indices of
 * `bits` bits packed LSB-first. Bits per value: 4.25 (turbo4), 3.25 (turbo3), 2.25 (turbo2).
 * Build with -ffp-contract=off: fused multiply-adds would change the results.
 */
#ifndef TURBOQUANT_H
#define TURBOQUANT_H

#include <stddef.h>
#include <stdint.h>

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

/* IEEE fp16 conversions (round to nearest even), exposed for the tests. */
uint16_t tq_fp32_to_fp16(float f);
float tq_fp16_to_fp32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif
