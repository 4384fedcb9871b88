/* One decode step (one new token a row) of a Llama-style decoder layer in float32, in one parallel region:
   models/decode_layer.py says when and why. Built with few_rows.c into one library (models/few_rows.py). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>

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
    __m512 acc = _mm512_setzero_ps();
    long i = 0;
    for (; i + 16 <= H; i += 16) {
      __m512 v = _mm512_loadu_ps(xr + i);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    float ss = _mm512_reduce_add_ps(acc);
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

static inline float dot(const float* a, const float* b, long D) {
  __m512 acc = _mm512_setzero_ps();
  for (long i = 0; i < D; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  return _mm512_reduce_add_ps(acc);
}

/* exp(x) in 16 lanes to about an ulp: x = n ln 2 + r, |r| <= ln 2 / 2, exp(r) by its Taylor series to r^7 (the
   next term is below float's epsilon), times 2^n; x below -88.4 gives 2^-127.5 (callers that need 0 mask it) */
static inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.3762626647949f)), _mm512_set1_ps(88.3762626647949f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
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
  __m512 sum = _mm512_setzero_ps(), top = _mm512_set1_ps(m), none = _mm512_set1_ps(-INFINITY);
  for (long t = 0; t <= T; t += 16) {
    __mmask16 in = (t + 16 <= T + 1) ? (__mmask16)0xFFFF : (__mmask16)((1u << (T + 1 - t)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(in, s + t);
    __mmask16 live = _mm512_mask_cmp_ps_mask(in, v, none, _CMP_NEQ_OQ);
    __m512 p = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(v, top)));
    _mm512_mask_storeu_ps(s + t, in, p);
    sum = _mm512_add_ps(sum, p);
  }
  float l = _mm512_reduce_add_ps(sum), inv = l > 0.0f ? 1.0f / l : 0.0f;
  __m512 acc[16];
  long vecs = D / 16;
  for (long j = 0; j < vecs; j++) acc[j] = _mm512_setzero_ps();
  for (long t = 0; t <= T; t++) {
    if (s[t] == 0.0f) continue;
    __m512 p = _mm512_set1_ps(s[t]);
    for (long j = 0; j < vecs; j++) acc[j] = _mm512_fmadd_ps(p, _mm512_loadu_ps(V + t * D + j * 16), acc[j]);
  }
  for (long j = 0; j < vecs; j++) _mm512_storeu_ps(out + j * 16, _mm512_mul_ps(acc[j], _mm512_set1_ps(inv)));
}

/* g[r, n0:n1] = silu(g + bg) * (u + bu), silu(a) = a / (1 + exp(-a)), each row of I */
static void gated(float* g, const float* u, const float* bg, const float* bu, long R, long I, long n0, long n1) {
  for (long r = 0; r < R; r++)
    for (long n = n0; n < n1; n += 16) {
      __mmask16 in = (n + 16 <= n1) ? (__mmask16)0xFFFF : (__mmask16)((1u << (n1 - n)) - 1);
      __m512 a = _mm512_maskz_loadu_ps(in, g + r * I + n), b = _mm512_maskz_loadu_ps(in, u + r * I + n);
      if (bg) a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(in, bg + n));
      if (bu) b = _mm512_add_ps(b, _mm512_maskz_loadu_ps(in, bu + n));
      __m512 silu = _mm512_div_ps(a, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), a))));
      _mm512_mask_storeu_ps(g + r * I + n, in, _mm512_mul_ps(silu, b));
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
