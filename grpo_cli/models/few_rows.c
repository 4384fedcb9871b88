/* y[R, N] = x[R, K] @ W[N, K]^T in float32 for a few rows R (a decode step's batch): models/few_rows.py says why.
   Built by few_rows.py with `-O3 -march=native -fopenmp` after torch is loaded, so libgomp.so.1 is torch's own and its
   threads are the ones torch uses. */
#include <omp.h>
#include <stdlib.h>

#include "simd.h"

#if LANES == 16
/* AVX-512: a tile is 4 rows of x against 4 rows of W, 16 accumulators of 16 lanes (of the 32 registers), each the
   partial sums of one output over K in its lanes, added across lanes at the end */
#define SHARE 4 /* a thread's share of the outputs: whole blocks of this many rows of W */

/* rb (<= 4) rows of x against nb (<= 4) rows of W over the whole of K: rb x nb accumulators of 16 lanes. The next
   block of 4 rows of W (`ahead`; null for the last blocks) is prefetched a cache line per step, its lines spread
   over the `passes` tiles that read this block, so the memory read runs under the products. */
static inline __attribute__((always_inline)) void tile(const float* x, const float* w, long K, float* y, long ldy,
                                                       int rb, int nb, const float* ahead, long pass, long passes,
                                                       int add) {
  __m512 acc[16];
  for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
  long steps = (K + 15) / 16, lines = steps * 4, whole = K / 16;
  for (long s = 0; s < steps; s++) {
    long k = s * 16;
    if (ahead) /* this tile's share of the next block's lines */
      for (long line = pass * steps + s; line < lines; line += steps * passes)
        _mm_prefetch((const char*)(ahead + (line & 3) * K + (line >> 2) * 16), _MM_HINT_T0);
    __m512 wv[4];
    if (s < whole) { /* whole vectors of K: plain loads (the masked ones below cost a third of the products) */
      for (int j = 0; j < nb; j++) wv[j] = _mm512_loadu_ps(w + j * K + k);
      for (int r = 0; r < rb; r++) {
        __m512 xv = _mm512_loadu_ps(x + r * K + k);
        for (int j = 0; j < nb; j++) acc[r * 4 + j] = _mm512_fmadd_ps(wv[j], xv, acc[r * 4 + j]);
      }
    } else { /* K's last K % 16 */
      __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
      for (int j = 0; j < nb; j++) wv[j] = _mm512_maskz_loadu_ps(m, w + j * K + k);
      for (int r = 0; r < rb; r++) {
        __m512 xv = _mm512_maskz_loadu_ps(m, x + r * K + k);
        for (int j = 0; j < nb; j++) acc[r * 4 + j] = _mm512_fmadd_ps(wv[j], xv, acc[r * 4 + j]);
      }
    }
  }
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
  float sums[16];
  _mm512_storeu_ps(sums, _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD)));
  for (int r = 0; r < rb; r++)
    for (int j = 0; j < nb; j++) y[r * ldy + j] = add ? y[r * ldy + j] + sums[4 * j + r] : sums[4 * j + r];
}

/* Rows [n0, n1) of W against every row of x, into (add: added to) y[:, n0:n1]: blocks of 4 rows of W, each read once
   from memory and then from the L1 cache by the ceil(R / 4) tiles of 4 rows of x. decode_layer.c's products too. */
void few_rows_block(const float* x, long R, const float* W, long n0, long n1, long N, long K, float* y, int add) {
  long passes = (R + 3) / 4;
  for (long n = n0; n < n1; n += 4) {
    int nb = (n1 - n >= 4) ? 4 : (int)(n1 - n);
    const float* ahead = (n + 8 <= n1) ? W + (n + 4) * K : 0;
    for (long r = 0, pass = 0; r < R; r += 4, pass++) {
      int rb = (R - r >= 4) ? 4 : (int)(R - r);
      switch (rb * 8 + nb) { /* each tile shape a constant, unrolled by the compiler */
#define TILE(RB, NB) \
  case RB * 8 + NB: tile(x + r * K, W + n * K, K, y + r * N + n, N, RB, NB, ahead, pass, passes, add); break;
        TILE(4, 4) TILE(4, 3) TILE(4, 2) TILE(4, 1) TILE(3, 4) TILE(3, 3) TILE(3, 2) TILE(3, 1)
        TILE(2, 4) TILE(2, 3) TILE(2, 2) TILE(2, 1) TILE(1, 4) TILE(1, 3) TILE(1, 2) TILE(1, 1)
#undef TILE
      }
    }
  }
}

#else
/* AVX2: 16 registers hold too few of those tiles (GCC then reads each weight vector again for every row of x), so
   the product is turned around: x is packed transposed ([K][up to 24 rows], zeros past R; a thread's own buffer),
   and a tile is nb rows of W against rv vectors of 8 rows of x, nb x rv accumulators (12 of the 16 registers): for
   each k, the rv vectors of x[:, k] and each W[n, k] broadcast, one multiply-add per accumulator. Each output is
   one lane's sum over k in order; nothing is added across lanes. 1.0-1.2x the rate of 4 x 3 tiles of the other
   layout at 4-8 and 24 rows, 1.3-2.2x at 13-16 (a C microbench, bench/RESULTS.md). A tile's nb weight rows are nb
   streams the hardware prefetcher finds anew for each tile (and loses at every 4 KiB page): the tile prefetches the
   next one's rows into L2 while it multiplies, 1.3x the rate at 16 rows on one core (on two, a generate is bound by
   their shared reads as much; lines further ahead in its own rows were slower). */
#define PACKED_ROWS 24 /* rows of x a pass packs: 3 vectors */
#define SHARE 12       /* a thread's share of the outputs: whole blocks of this many rows of W (12, 6 or 4 a tile) */

static inline __attribute__((always_inline)) void tile(const float* xt, long rp, const float* w, long K, float* y,
                                                       long ldy, long rows, int nb, int rv, int add,
                                                       const float* ahead) {
  vf acc[12];
#pragma GCC unroll 12
  for (int i = 0; i < 12; i++) acc[i] = vzero();
  for (long k = 0; k < K; k++) {
    if (ahead) /* the next tile's nb rows of W (contiguous: nb K floats), a line every 16 / nb steps */
      for (long line = (k * nb) >> 4, end = ((k + 1) * nb) >> 4; line < end; line++)
        _mm_prefetch((const char*)(ahead + line * 16), _MM_HINT_T1);
    vf xv[3];
    for (int v = 0; v < rv; v++) xv[v] = vload(xt + k * rp + v * LANES);
    for (int j = 0; j < nb; j++) {
      vf b = vbcast(w + j * K + k);
      for (int v = 0; v < rv; v++) acc[j * rv + v] = vfma(b, xv[v], acc[j * rv + v]);
    }
  }
  float out[12][LANES]; /* stored whole, with constant indices: a variable one keeps GCC's accumulators in memory */
#pragma GCC unroll 12
  for (int i = 0; i < 12; i++)
    if (i < nb * rv) vstore(out[i], acc[i]);
  for (int j = 0; j < nb; j++)
    for (long r = 0; r < rows; r++) {
      float* dst = y + r * ldy + j;
      *dst = add ? *dst + out[j * rv + r / LANES][r % LANES] : out[j * rv + r / LANES][r % LANES];
    }
}

static __thread float* packed; /* each thread's transposed rows of x, kept for its next product */
static __thread long packed_floats;

void few_rows_block(const float* x, long R, const float* W, long n0, long n1, long N, long K, float* y, int add) {
  if (packed_floats < PACKED_ROWS * K) {
    free(packed);
    packed = aligned_alloc(64, (PACKED_ROWS * K * sizeof(float) + 63) / 64 * 64);
    packed_floats = packed ? PACKED_ROWS * K : 0;
    if (!packed) abort();
  }
  for (long r0 = 0; r0 < R; r0 += PACKED_ROWS) {
    long rows = R - r0 < PACKED_ROWS ? R - r0 : PACKED_ROWS;
    int rv = (int)((rows + LANES - 1) / LANES), most = rv == 1 ? 12 : rv == 2 ? 6 : 4;
    long rp = rv * LANES;
    for (long k = 0; k < K; k++)
      for (long r = 0; r < rp; r++) packed[k * rp + r] = r < rows ? x[(r0 + r) * K + k] : 0.0f;
    for (long n = n0; n < n1; n += most) {
      int nb = n1 - n >= most ? most : (int)(n1 - n);
      const float* ahead = n + 2 * most <= n1 ? W + (n + most) * K : 0; /* a whole tile follows */
      switch (rv * 16 + nb) { /* each tile shape a constant, unrolled by the compiler */
#define TILE(RV, NB) \
  case RV * 16 + NB: tile(packed, rp, W + n * K, K, y + r0 * N + n, N, rows, NB, RV, add, ahead); break;
        TILE(1, 1) TILE(1, 2) TILE(1, 3) TILE(1, 4) TILE(1, 5) TILE(1, 6) TILE(1, 7) TILE(1, 8) TILE(1, 9)
        TILE(1, 10) TILE(1, 11) TILE(1, 12) TILE(2, 1) TILE(2, 2) TILE(2, 3) TILE(2, 4) TILE(2, 5) TILE(2, 6)
        TILE(3, 1) TILE(3, 2) TILE(3, 3) TILE(3, 4)
#undef TILE
      }
    }
  }
}
#endif

/* Each output is one thread's sum over K, in the same order whatever the number of threads: the result does not
   depend on them. */
/* Thread t of nt's share [n0, n1) of N outputs: whole blocks of SHARE (the tiles few_rows_block reads), empty for a
   thread past the last block. decode_layer.c's products split the same way. */
void few_rows_share(long N, long t, long nt, long* n0, long* n1) {
  long blocks = (N + SHARE - 1) / SHARE, per = (blocks + nt - 1) / nt, b0 = t * per;
  long b1 = b0 + per < blocks ? b0 + per : blocks;
  *n1 = b1 * SHARE < N ? b1 * SHARE : N;
  *n0 = b0 * SHARE < *n1 ? b0 * SHARE : *n1;
}

void few_rows_product(const float* x, long R, const float* W, long N, long K, float* y, int threads) {
#pragma omp parallel num_threads(threads)
  {
    long n0, n1;
    few_rows_share(N, omp_get_thread_num(), omp_get_num_threads(), &n0, &n1);
    if (n0 < n1) few_rows_block(x, R, W, n0, n1, N, K, y, 0);
  }
}
