/* One decode step (one new token a row) of a Llama-style decoder layer in float32, in one parallel region:
   models/decode_layer.py says when and why. Built with few_rows.c into one library (models/few_rows.py). */
#include <math.h>
#include <omp.h>

#include "simd.h"

#define MAX_HEAD_DIM 256 /* decode_layer.py's: a head's output is kept in MAX_HEAD_DIM / LANES vectors */

void few_rows_block(const float* x, long R, const float* W, long n0, long n1, long N, long K, float* y, int add);
void few_rows_share(long N, long t, long nt, long* n0, long* n1);

/* Field for field models/decode_layer.py's `Layer`. */
typedef struct {
  long rows, hidden, heads, kv_heads, head_dim, intermediate, capacity, position, mask_stride, threads;
  double eps1, eps2, scale;
  const float *norm1, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *norm2, *wg, *bg, *wu, *bu, *wd, *bd;
  const float *cos, *sin;    /* [rows, head_dim]: the new position's rotary embedding */
  float *keys, *values;      /* [rows, kv_heads, capacity, head_dim]: written at `position` */
  const unsigned char* mask; /* [rows, mask_stride]: nonzero where position t <= `position` is seen; null: all */
  float* hidden_states;      /* [rows, hidden], the layer's input, replaced by its output */
  float* work; /* rows x (hidden + 2 (heads + kv_heads) head_dim + 2 intermediate) + threads x (position + 1) floats */
} Layer;

/* y[:, n0:n1] (+)= x @ W[n0:n1]^T + b[n0:n1], y's rows N apart */
static void product(const float* x, long R, const float* W, const float* b, long N, long K, float* y, int add,
                    long t, long nt) {
  long n0, n1;
  few_rows_share(N, t, nt, &n0, &n1);
  if (n0 >= n1) return;
  few_rows_block(x, R, W, n0, n1, N, K, y, add);
  if (b)
    for (long r = 0; r < R; r++)
      for (long n = n0; n < n1; n++) y[r * N + n] += b[n];
}

/* out = w * (x * 1 / sqrt(mean(x^2) + eps)), each row (the model's RMS norm, in its order) */
static void rms_norm(const float* x, const float* w, long R, long H, double eps, float* out) {
  for (long r = 0; r < R; r++) {
    const float* xr = x + r * H;
    vf acc = vzero();
    long i = 0;
    for (; i + LANES <= H; i += LANES) {
      vf v = vload(xr + i);
      acc = vfma(v, v, acc);
    }
    float ss = vsum(acc);
    for (; i < H; i++) ss += xr[i] * xr[i];
    float inv = 1.0f / sqrtf(ss / (float)H + (float)eps);
    for (i = 0; i < H; i++) out[r * H + i] = w[i] * (xr[i] * inv);
  }
}

/* v * cos + rotate_half(v) * sin, rotate_half(v) = [-v[D/2:], v[:D/2]] (Llama's rotary), into out */
static void rotate(const float* v, const float* cos, const float* sin, long D, float* out) {
  long half = D / 2;
  for (long i = 0; i < half; i++) {
    out[i] = v[i] * cos[i] - v[i + half] * sin[i];
    out[i + half] = v[i + half] * cos[i + half] + v[i] * sin[i + half];
  }
}

static inline float dot(const float* a, const float* b, long D) { /* D a multiple of 16 */
  vf acc = vzero();
  for (long i = 0; i < D; i += LANES) acc = vfma(vload(a + i), vload(b + i), acc);
  return vsum(acc);
}

/* softmax(q . K[t] * scale over the seen t <= T) @ V: the scores into `s` (T + 1 floats), their exponentials less
   the largest, then the values weighted by them */
static void attend(const float* q, const float* K, const float* V, long T, long D, float scale,
                   const unsigned char* seen, float* s, float* out) {
  float m = -INFINITY;
  for (long t = 0; t <= T; t++) {
    s[t] = (seen && !seen[t]) ? -INFINITY : dot(q, K + t * D, D) * scale;
    m = s[t] > m ? s[t] : m;
  }
  vf sum = vzero(), top = vset1(m), none = vset1(-INFINITY);
  for (long t = 0; t <= T; t += LANES) {
    long n = T + 1 - t; /* the lanes in range: all but in the last vector */
    vf v = vloadn(s + t, n);
    vf p = vfirst(vunless(v, none, vexp(vsub(v, top))), n);
    vstoren(s + t, p, n);
    sum = vadd(sum, p);
  }
  float l = vsum(sum), inv = l > 0.0f ? 1.0f / l : 0.0f;
  vf acc[MAX_HEAD_DIM / LANES];
  long vecs = D / LANES;
  for (long j = 0; j < vecs; j++) acc[j] = vzero();
  for (long t = 0; t <= T; t++) {
    if (s[t] == 0.0f) continue;
    vf p = vset1(s[t]);
    for (long j = 0; j < vecs; j++) acc[j] = vfma(p, vload(V + t * D + j * LANES), acc[j]);
  }
  for (long j = 0; j < vecs; j++) vstore(out + j * LANES, vmul(acc[j], vset1(inv)));
}

/* g[r, n0:n1] = silu(g + bg) * (u + bu), silu(a) = a / (1 + exp(-a)), each row of I */
static void gated(float* g, const float* u, const float* bg, const float* bu, long R, long I, long n0, long n1) {
  for (long r = 0; r < R; r++)
    for (long n = n0; n < n1; n += LANES) {
      long in = n1 - n; /* the lanes in range */
      vf a = vloadn(g + r * I + n, in), b = vloadn(u + r * I + n, in);
      if (bg) a = vadd(a, vloadn(bg + n, in));
      if (bu) b = vadd(b, vloadn(bu + n, in));
      vf silu = vdiv(a, vadd(vset1(1.0f), vexp(vsub(vzero(), a))));
      vstoren(g + r * I + n, vmul(silu, b), in);
    }
}

void decode_layer(const Layer* L) {
  long R = L->rows, H = L->hidden, D = L->head_dim, NQ = L->heads * D, NK = L->kv_heads * D, I = L->intermediate;
  long group = L->heads / L->kv_heads, P = L->position, C = L->capacity;
  float *h = L->hidden_states, *x = L->work, *q = x + R * H, *k = q + R * NQ, *v = k + R * NK, *att = v + R * NK;
  float *g = att + R * NQ, *u = g + R * I, *scores = u + R * I;
#pragma omp parallel num_threads(L->threads)
  {
    long t = omp_get_thread_num(), nt = omp_get_num_threads();
#pragma omp single
    rms_norm(h, L->norm1, R, H, L->eps1, x);
    product(x, R, L->wq, L->bq, NQ, H, q, 0, t, nt);
    product(x, R, L->wk, L->bk, NK, H, k, 0, t, nt);
    product(x, R, L->wv, L->bv, NK, H, v, 0, t, nt);
#pragma omp barrier
#pragma omp for schedule(static)
    for (long task = 0; task < R * L->kv_heads; task++) { /* the new position's key (rotated) and value, cached */
      long r = task / L->kv_heads;
      float* key = L->keys + (task * C + P) * D;
      rotate(k + task * D, L->cos + r * D, L->sin + r * D, D, key);
      for (long i = 0; i < D; i++) L->values[(task * C + P) * D + i] = v[task * D + i];
    }
#pragma omp for schedule(static)
    for (long task = 0; task < R * L->heads; task++) {
      long r = task / L->heads, kv = r * L->kv_heads + (task % L->heads) / group;
      float rotated[512];
      rotate(q + task * D, L->cos + r * D, L->sin + r * D, D, rotated);
      attend(rotated, L->keys + kv * C * D, L->values + kv * C * D, P, D, (float)L->scale,
             L->mask ? L->mask + r * L->mask_stride : 0, scores + t * (P + 1), att + task * D);
    }
    product(att, R, L->wo, L->bo, H, NQ, h, 1, t, nt); /* the residual: added into h */
#pragma omp barrier
#pragma omp single
    rms_norm(h, L->norm2, R, H, L->eps2, x);
    long n0, n1;
    few_rows_share(I, t, nt, &n0, &n1);
    if (n0 < n1) {
      few_rows_block(x, R, L->wg, n0, n1, I, H, g, 0);
      few_rows_block(x, R, L->wu, n0, n1, I, H, u, 0);
      gated(g, u, L->bg, L->bu, R, I, n0, n1);
    }
#pragma omp barrier
    product(g, R, L->wd, L->bd, H, I, h, 1, t, nt);
  }
}
