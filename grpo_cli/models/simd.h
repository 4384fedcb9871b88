/* The vector operations few_rows.c and decode_layer.c are written in, for the widest float vectors the compiling
   machine has (`-march=native`): AVX-512 (16 lanes, 32 registers) or AVX2 with FMA (8 lanes, 16 registers). Each
   operation is one or a few instructions, and each reduction adds its lanes in one fixed order, so a result depends
   on the machine's vector width, never on the number of threads or the call. */
#ifndef GRPO_SIMD_H
#define GRPO_SIMD_H
#include <immintrin.h>

#if defined(__AVX512F__)
#define LANES 16
typedef __m512 vf;
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vset1(float a) { return _mm512_set1_ps(a); }
static inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
static inline vf vbcast(const float* p) { return _mm512_set1_ps(*p); } /* *p in every lane */
static inline __mmask16 first(long n) { return (__mmask16)((1u << n) - 1); } /* n < 16 */
/* p[0:n] and zeros, 0 <= n <= LANES: no byte past p + n is read */
static inline vf vloadn(const float* p, long n) { return n >= 16 ? vload(p) : _mm512_maskz_loadu_ps(first(n), p); }
static inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline void vstoren(float* p, vf v, long n) {
  if (n >= 16) vstore(p, v);
  else _mm512_mask_storeu_ps(p, first(n), v);
}
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }   /* a b + c */
static inline vf vfnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); } /* c - a b */
static inline vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf vscale2(vf p, vf n) { return _mm512_scalef_ps(p, n); } /* p 2^n, n whole */
static inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
/* `value` where a != b, 0 where they are equal */
static inline vf vunless(vf a, vf b, vf value) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_NEQ_OQ), value);
}
static inline vf vfirst(vf a, long n) { return n >= 16 ? a : _mm512_maskz_mov_ps(first(n), a); } /* then zeros */
#elif defined(__AVX2__) && defined(__FMA__)
#define LANES 8
typedef __m256 vf;
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vset1(float a) { return _mm256_set1_ps(a); }
static inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
static inline vf vbcast(const float* p) { return _mm256_broadcast_ss(p); }
static inline __m256i first(long n) { /* n < 8 */
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vloadn(const float* p, long n) { return n >= 8 ? vload(p) : _mm256_maskload_ps(p, first(n)); }
static inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
static inline void vstoren(float* p, vf v, long n) {
  if (n >= 8) vstore(p, v);
  else _mm256_maskstore_ps(p, first(n), v);
}
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vfnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf vround(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p 2^n for whole n in [-128, 128] (what vexp asks): two exact powers of two built from their exponent bits, so a
   result below float's normal range is rounded once, as AVX-512's scalef rounds it */
static inline vf vscale2(vf p, vf n) {
  __m256i k = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(k, 1), rest = _mm256_sub_epi32(k, half);
  __m256i bias = _mm256_set1_epi32(127);
  vf a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  vf b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}
static inline float vsum(vf a) { /* halves, then quarters, then the pair */
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline vf vunless(vf a, vf b, vf value) { return _mm256_and_ps(_mm256_cmp_ps(a, b, _CMP_NEQ_OQ), value); }
static inline vf vfirst(vf a, long n) { return n >= 8 ? a : _mm256_and_ps(_mm256_castsi256_ps(first(n)), a); }
#else
#error "models/few_rows.c needs AVX-512F or AVX2 with FMA"
#endif

/* exp(x) in each lane to about an ulp: x = n ln 2 + r, |r| <= ln 2 / 2, exp(r) by its Taylor series to r^7 (the
   next term is below float's epsilon), times 2^n; x below -88.4 gives 2^-127.5 (callers that need 0 mask it) */
static inline vf vexp(vf x) {
  x = vmin(vmax(x, vset1(-88.3762626647949f)), vset1(88.3762626647949f));
  vf n = vround(vmul(x, vset1(1.44269504088896341f)));
  vf r = vfnma(n, vset1(0.693359375f), x);
  r = vfnma(n, vset1(-2.12194440e-4f), r);
  vf p = vset1(1.0f / 5040);
  p = vfma(p, r, vset1(1.0f / 720));
  p = vfma(p, r, vset1(1.0f / 120));
  p = vfma(p, r, vset1(1.0f / 24));
  p = vfma(p, r, vset1(1.0f / 6));
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.0f));
  p = vfma(p, r, vset1(1.0f));
  return vscale2(p, n);
}
#endif
