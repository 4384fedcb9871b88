/* y[R, N] = x[R, K] @ W[N, K]^T in float32 for a few rows R (a decode step's batch): models/few_rows.py says why.
   Built by few_rows.py with `-O3 -march=native -fopenmp` after torch is loaded, so libgomp.so.1 is torch's own and its
   threads are the ones torch uses. */
#include <omp.h>

#include "simd.h"

#ifndef TILE_ROWS
#define TILE_ROWS 4 /* rows of x a tile multiplies at once; TILE_COLS rows of W (simd.h: by the registers) */
#endif

/* rb (<= TILE_ROWS) rows of x against nb (<= TILE_COLS) rows of W over the whole of K: rb x nb accumulators of LANES
   lanes. The next block of TILE_COLS rows of W (`ahead`; null for the last blocks) is prefetched a cache line at a
   time, its lines spread over the steps of the `passes` tiles that read this block, so the memory read runs under
   the products. */
static inline __attribute__((always_inline)) void tile(const float* x, const float* w, long K, float* y, long ldy,
                                                       int rb, int nb, const float* ahead, long pass, long passes,
                                                       int add) {
  vf acc[TILE_ROWS * TILE_COLS];
  for (int i = 0; i < TILE_ROWS * TILE_COLS; i++) acc[i] = vzero();
  long steps = (K + LANES - 1) / LANES, whole = K / LANES, lines = (K + 15) / 16 * TILE_COLS;
  for (long s = 0; s < steps; s++) {
    long k = s * LANES, n = s < whole ? LANES : K - k; /* lanes of K: all but in the last step where K % LANES */
    if (ahead) /* this tile's share of the next block's lines (16 floats a line), the block's rows interleaved */
      for (long line = pass * steps + s; line < lines; line += steps * passes)
        _mm_prefetch((const char*)(ahead + (line % TILE_COLS) * K + (line / TILE_COLS) * 16), _MM_HINT_T0);
    vf wv[TILE_COLS];
    for (int j = 0; j < nb; j++) {
      wv[j] = n == LANES ? vload(w + j * K + k) : vloadn(w + j * K + k, n);
#if LANES == 8
      __asm__("" : "+v"(wv[j])); /* held in a register: GCC 12 loads it again for each row of x (1.3-1.6x slower) */
#endif
    }
    for (int r = 0; r < rb; r++) {
      vf xv = n == LANES ? vload(x + r * K + k) : vloadn(x + r * K + k, n);
      for (int j = 0; j < nb; j++) acc[r * TILE_COLS + j] = vfma(wv[j], xv, acc[r * TILE_COLS + j]);
    }
  }
  float sums[TILE_ROWS * TILE_COLS]; /* sums[r * TILE_COLS + j]: acc[r * TILE_COLS + j]'s lanes added */
#if LANES == 16
  /* the 16 accumulators' sums in one vector, halves then quarters of 128-bit lanes then pairs of lanes added (a
     fixed order): lane 4 j + r is the sum of acc[r * 4 + j] */
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; i++)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; i++)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; i++)
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
  float lanes[16];
  _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD)));
  for (int r = 0; r < 4; r++)
    for (int j = 0; j < 4; j++) sums[r * 4 + j] = lanes[4 * j + r];
#else
  for (int r = 0; r < rb; r++)
    for (int j = 0; j < nb; j++) sums[r * TILE_COLS + j] = vsum(acc[r * TILE_COLS + j]);
#endif
  for (int r = 0; r < rb; r++)
    for (int j = 0; j < nb; j++)
      y[r * ldy + j] = add ? y[r * ldy + j] + sums[r * TILE_COLS + j] : sums[r * TILE_COLS + j];
}

/* Rows [n0, n1) of W against every row of x, into (add: added to) y[:, n0:n1]: blocks of TILE_COLS rows of W, each
   read once from memory and then from the L1 cache by the ceil(R / TILE_ROWS) tiles of rows of x. decode_layer.c's
   products too. */
void few_rows_block(const float* x, long R, const float* W, long n0, long n1, long N, long K, float* y, int add) {
  long passes = (R + TILE_ROWS - 1) / TILE_ROWS;
  for (long n = n0; n < n1; n += TILE_COLS) {
    int nb = (n1 - n >= TILE_COLS) ? TILE_COLS : (int)(n1 - n);
    const float* ahead = (n + 2 * TILE_COLS <= n1) ? W + (n + TILE_COLS) * K : 0;
    for (long r = 0, pass = 0; r < R; r += TILE_ROWS, pass++) {
      int rb = (R - r >= TILE_ROWS) ? TILE_ROWS : (int)(R - r);
      switch (rb * 8 + nb) { /* each tile shape a constant, unrolled by the compiler */
#define TILE(RB, NB) \
  case RB * 8 + NB: tile(x + r * K, W + n * K, K, y + r * N + n, N, RB, NB, ahead, pass, passes, add); break;
        TILE(4, 3) TILE(4, 2) TILE(4, 1) TILE(3, 3) TILE(3, 2) TILE(3, 1)
        TILE(2, 3) TILE(2, 2) TILE(2, 1) TILE(1, 3) TILE(1, 2) TILE(1, 1)
#if TILE_COLS == 4
        TILE(4, 4) TILE(3, 4) TILE(2, 4) TILE(1, 4)
#endif
#undef TILE
      }
    }
  }
}

/* Each output is one thread's sum over K, in the same order whatever the number of threads: the result does not
   depend on them. */
/* Thread t of nt's share [n0, n1) of N outputs: whole blocks of TILE_COLS (the tiles few_rows_block reads), empty
   for a thread past the last block. decode_layer.c's products split the same way. */
void few_rows_share(long N, long t, long nt, long* n0, long* n1) {
  long blocks = (N + TILE_COLS - 1) / TILE_COLS, per = (blocks + nt - 1) / nt, b0 = t * per;
  long b1 = b0 + per < blocks ? b0 + per : blocks;
  *n1 = b1 * TILE_COLS < N ? b1 * TILE_COLS : N;
  *n0 = b0 * TILE_COLS < *n1 ? b0 * TILE_COLS : *n1;
}

void few_rows_product(const float* x, long R, const float* W, long N, long K, float* y, int threads) {
#pragma omp parallel num_threads(threads)
  {
    long n0, n1;
    few_rows_share(N, omp_get_thread_num(), omp_get_num_threads(), &n0, &n1);
    if (n0 < n1) few_rows_block(x, R, W, n0, n1, N, K, y, 0);
  }
}
