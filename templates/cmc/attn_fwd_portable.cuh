// ===========================================================================================
// cmc portable forward attention: FlashAttention-2 style, mma.sync m16n8k16, sm_80 and newer.
// Hand-written. cmc/emit.py inlines this text into NAME.cu (the .cu is self-contained: no
// include directive anywhere, so NVRTC parses little and the cubin depends on nothing outside it).
//
// Layout of NAME.cu (templates/kernel.cu.j2):
//   1. the descriptor struct `cmc_<mask>_desc` (cmc/abi.py) and its layout static_asserts
//   2. this header: part A (integer semantics, interval arithmetic, tile plan; also builds
//      on the host with -DCMC_HOST, which is how tests/test_emit.py cross-checks it against
//      cmc.evaluate) and part B (the kernel, device only)
//   3. the mask hooks, generated from the IntervalTable: `struct cmc_hooks`
//   4. one `#if defined(CMC_VARIANT_<dtype>_d<hd>)` block per entry point
//
// ------------------------------------------------------------------------- hook contract
// The kernel is a template over a hook struct H (names are dependent, so the hooks may be
// defined after this header). H provides:
//
//   typedef <descriptor struct> desc_t;
//   enum { kTerms };                  // term instances of the table (families expanded)
//   struct seq_t { int len; cmc_i64 tok0; ...mask params of this sequence... };
//   struct row_t { int q; ...k-free values of one query row... };
//   static seq_t seq(const desc_t& d, int b);
//       sequence b: tok0 = cu_seqlens[b], len = cu_seqlens[b+1] - tok0, int[batch] params
//       loaded as ((const int*)d.p_NAME)[b], segment starts as a (pointer, count) slice of
//       d.p_S_starts between d.p_S_offsets[b] and [b+1], scalar params copied.
//   static row_t row(const seq_t& s, int q);
//       everything of the mask predicate that does not depend on k, computed once per row
//       (e.g. seg_start(S, q), len - n_targets); same(S, q, k) becomes an exact membership
//       interval for k, so no per-element binary search.
//   static bool visible(const seq_t& s, const row_t& r, int k);
//       the mask's own predicate (ir.Mask.predicate), exact, integer semantics of
//       cmc/evaluate.py. The kernel adds k < len. Only called on partial tiles.
//   static void term(const seq_t& s, int qa, int qb, int i, int* out4);
//       term instance i (0 <= i < kTerms) over the query rows q in [qa, qb] (qb < len), by
//       interval arithmetic (sound for every expression node):
//         out4[0..1] = touched keys [max(0, lo_min), min(len, hi_max)) if the guard may hold,
//                      else empty
//         out4[2..3] = full keys [max(0, lo_max), min(len, hi_min)) if the guard must hold on
//                      every row and the term has no residual, else empty
//       Every visible (q, k) with q in [qa, qb] lies in some touched range; every key of a
//       full range is visible from every row of [qa, qb].
//   static bool span(const seq_t& s, const row_t& r, int i, int& lo, int& hi);
//       term instance i for the one row r, exactly: [lo, hi) = its key interval clamped to
//       [0, len) when its guard holds, else empty. False (and empty) for a term with a
//       residual. For an exact table the union over i is exactly {k < len : visible(r, k)},
//       and every span lies inside that term's touched range of any [qa, qb] holding r.q.
//
// The kernel builds a per-CTA plan from these (cmc_plan_place / cmc_plan_merge): the sorted
// union of touched key tiles (walked in order; a tile no term touches is never loaded) and
// the key tiles inside the union of full ranges (no mask work). Every other walked tile is
// partial: the portable kernel evaluates visible(q, k) && k < len per element; the sm90
// kernel ORs the spans of the terms touching the tile into a per-thread column bit mask
// (cmc_colmask32), one bit test per element, and falls back to visible() only when a term
// touching the tile has a residual.
//
// --------------------------------------------------------------------------- the kernel
// grid (ceil(max_len / 128), heads_q, batch), block 256 = 8 warps x 16 query rows (MT = 1;
// MT = 2 gives 128 threads = 4 warps x 32 rows, selected by emit / -DCMC_PORTABLE_MT), key tiles
// of 64, K/V double-buffered through cp.async (16 B, zero-fill past len), 128 B XOR-swizzled
// shared memory rows, Q fragments held in registers, fp32 online softmax in exp2 units
// (desc.scale_log2 = softmax scale * log2(e), must be > 0), LSE in natural-log units.
// Requirements: Q/K/V/O base pointers and token strides 16-byte aligned (multiples of 8
// elements), head dim contiguous; segment starts sorted ascending within each sequence.
// Integer values of mask expressions must stay inside int64 (as in cmc/evaluate.py).
// ===========================================================================================

#if defined(CMC_HOST)
#define CMC_DEV inline
#define CMC_TABLE static const
#else
#define CMC_DEV __device__ __forceinline__
#define CMC_TABLE static __constant__ const
#endif

typedef long long cmc_i64;

// ==================================================================== part A: host + device

// ------------------------------------------------------------ integer semantics (evaluate)
// Floor division and its remainder; x / 0 == 0 and x % 0 == x. The b == -1 cases avoid the
// INT_MIN / -1 trap (emit types a node int64 whenever its result may leave int32).
CMC_DEV int cmc_fdiv(int a, int b) {
  if (b == 0) return 0;
  if (b == -1) return -a;
  const int q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
CMC_DEV cmc_i64 cmc_fdiv(cmc_i64 a, cmc_i64 b) {
  if (b == 0) return 0;
  if (b == -1) return -a;
  const cmc_i64 q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
CMC_DEV int cmc_fmod(int a, int b) {
  if (b == 0) return a;
  if (b == -1) return 0;
  const int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
CMC_DEV cmc_i64 cmc_fmod(cmc_i64 a, cmc_i64 b) {
  if (b == 0) return a;
  if (b == -1) return 0;
  const cmc_i64 r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
CMC_DEV int cmc_min(int a, int b) { return a < b ? a : b; }
CMC_DEV int cmc_max(int a, int b) { return a > b ? a : b; }
CMC_DEV int cmc_abs(int a) { return a < 0 ? -a : a; }
CMC_DEV cmc_i64 cmc_min(cmc_i64 a, cmc_i64 b) { return a < b ? a : b; }
CMC_DEV cmc_i64 cmc_max(cmc_i64 a, cmc_i64 b) { return a > b ? a : b; }
CMC_DEV cmc_i64 cmc_abs(cmc_i64 a) { return a < 0 ? -a : a; }

// ------------------------------------------------------------------------ segment lookups
// Starts s[0..n) sorted ascending. seg(x) = (number of starts <= x) - 1.
CMC_DEV int cmc_seg(const int* s, int n, cmc_i64 x) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if ((cmc_i64)s[mid] <= x) lo = mid + 1; else hi = mid;
  }
  return lo - 1;
}
// seg_start: 0 for segment -1, else its start. seg_end: the next start, or len for the last.
CMC_DEV int cmc_seg_start_j(const int* s, int j) { return j < 0 ? 0 : s[j]; }
CMC_DEV int cmc_seg_end_j(const int* s, int n, int len, int j) { return j + 1 < n ? s[j + 1] : len; }
CMC_DEV int cmc_seg_start(const int* s, int n, cmc_i64 x) { return cmc_seg_start_j(s, cmc_seg(s, n, x)); }
CMC_DEV int cmc_seg_end(const int* s, int n, int len, cmc_i64 x) {
  return cmc_seg_end_j(s, n, len, cmc_seg(s, n, x));
}

// ---------------------------------------------------------------------- interval arithmetic
// Intervals of int64 with saturation: a lower end <= -CMC_IV_BIG means -inf, an upper end
// >= CMC_IV_BIG means +inf (every finite end is a true bound). Any +,-,*,/ on an infinite end
// gives the whole line: sound and simple (it only happens for absurd masks).
#define CMC_IV_BIG (1LL << 61)
struct cmc_iv { cmc_i64 lo, hi; };
struct cmc_tv { bool may, must; };  // three-valued truth over a set of rows

CMC_DEV cmc_i64 cmc_sat(cmc_i64 x) { return x > CMC_IV_BIG ? CMC_IV_BIG : (x < -CMC_IV_BIG ? -CMC_IV_BIG : x); }
CMC_DEV cmc_iv cmc_iv_mk(cmc_i64 lo, cmc_i64 hi) { cmc_iv r; r.lo = cmc_sat(lo); r.hi = cmc_sat(hi); return r; }
CMC_DEV cmc_iv cmc_iv_pt(cmc_i64 v) { return cmc_iv_mk(v, v); }
CMC_DEV cmc_iv cmc_iv_top() { return cmc_iv_mk(-CMC_IV_BIG, CMC_IV_BIG); }
CMC_DEV bool cmc_iv_inf(cmc_iv a) { return a.lo <= -CMC_IV_BIG || a.lo >= CMC_IV_BIG || a.hi <= -CMC_IV_BIG || a.hi >= CMC_IV_BIG; }
CMC_DEV cmc_i64 cmc_i64min(cmc_i64 a, cmc_i64 b) { return a < b ? a : b; }
CMC_DEV cmc_i64 cmc_i64max(cmc_i64 a, cmc_i64 b) { return a > b ? a : b; }

CMC_DEV cmc_iv cmc_iv_add(cmc_iv a, cmc_iv b) {
  if (cmc_iv_inf(a) || cmc_iv_inf(b)) return cmc_iv_top();
  return cmc_iv_mk(a.lo + b.lo, a.hi + b.hi);
}
CMC_DEV cmc_iv cmc_iv_sub(cmc_iv a, cmc_iv b) {
  if (cmc_iv_inf(a) || cmc_iv_inf(b)) return cmc_iv_top();
  return cmc_iv_mk(a.lo - b.hi, a.hi - b.lo);
}
CMC_DEV cmc_iv cmc_iv_neg(cmc_iv a) { cmc_iv r; r.lo = -a.hi; r.hi = -a.lo; return r; }
CMC_DEV cmc_i64 cmc_smul(cmc_i64 a, cmc_i64 b) {  // |a|, |b| < 2^61: decide overflow in double
  const double p = (double)a * (double)b;
  if (p >= (double)CMC_IV_BIG) return CMC_IV_BIG;
  if (p <= -(double)CMC_IV_BIG) return -CMC_IV_BIG;
  return cmc_sat(a * b);
}
CMC_DEV cmc_iv cmc_iv_mul(cmc_iv a, cmc_iv b) {
  if (cmc_iv_inf(a) || cmc_iv_inf(b)) return cmc_iv_top();
  const cmc_i64 p0 = cmc_smul(a.lo, b.lo), p1 = cmc_smul(a.lo, b.hi);
  const cmc_i64 p2 = cmc_smul(a.hi, b.lo), p3 = cmc_smul(a.hi, b.hi);
  cmc_iv r;
  r.lo = cmc_i64min(cmc_i64min(p0, p1), cmc_i64min(p2, p3));
  r.hi = cmc_i64max(cmc_i64max(p0, p1), cmc_i64max(p2, p3));
  return r;
}
CMC_DEV cmc_iv cmc_iv_min(cmc_iv a, cmc_iv b) { cmc_iv r; r.lo = cmc_i64min(a.lo, b.lo); r.hi = cmc_i64min(a.hi, b.hi); return r; }
CMC_DEV cmc_iv cmc_iv_max(cmc_iv a, cmc_iv b) { cmc_iv r; r.lo = cmc_i64max(a.lo, b.lo); r.hi = cmc_i64max(a.hi, b.hi); return r; }
CMC_DEV cmc_iv cmc_iv_abs(cmc_iv a) {
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return cmc_iv_neg(a);
  cmc_iv r; r.lo = 0; r.hi = cmc_i64max(-a.lo, a.hi); return r;
}
// Unchecked: where emit._fits_unchecked proved that every value of a term lies strictly
// inside (-CMC_IV_BIG, CMC_IV_BIG), the saturation and infinity tests never fire, and these
// give the same intervals without them (cmc_iv_div is cmc_ivu_div with them).
CMC_DEV cmc_iv cmc_ivu_mk(cmc_i64 lo, cmc_i64 hi) { cmc_iv r; r.lo = lo; r.hi = hi; return r; }
CMC_DEV cmc_iv cmc_ivu_pt(cmc_i64 v) { return cmc_ivu_mk(v, v); }
CMC_DEV cmc_iv cmc_ivu_add(cmc_iv a, cmc_iv b) { return cmc_ivu_mk(a.lo + b.lo, a.hi + b.hi); }
CMC_DEV cmc_iv cmc_ivu_sub(cmc_iv a, cmc_iv b) { return cmc_ivu_mk(a.lo - b.hi, a.hi - b.lo); }
CMC_DEV cmc_iv cmc_ivu_mul(cmc_iv a, cmc_iv b) {
  const cmc_i64 p0 = a.lo * b.lo, p1 = a.lo * b.hi, p2 = a.hi * b.lo, p3 = a.hi * b.hi;
  return cmc_ivu_mk(cmc_i64min(cmc_i64min(p0, p1), cmc_i64min(p2, p3)),
                    cmc_i64max(cmc_i64max(p0, p1), cmc_i64max(p2, p3)));
}
CMC_DEV cmc_iv cmc_ivu_div(cmc_iv a, cmc_iv b) {
  if (b.lo == b.hi) {
    const cmc_i64 c = b.lo;
    if (c == 0) return cmc_ivu_pt(0);
    if (c > 0) return cmc_ivu_mk(cmc_fdiv(a.lo, c), cmc_fdiv(a.hi, c));
    return cmc_ivu_mk(cmc_fdiv(a.hi, c), cmc_fdiv(a.lo, c));
  }
  if (b.lo > 0 || b.hi < 0) {
    const cmc_i64 p0 = cmc_fdiv(a.lo, b.lo), p1 = cmc_fdiv(a.lo, b.hi);
    const cmc_i64 p2 = cmc_fdiv(a.hi, b.lo), p3 = cmc_fdiv(a.hi, b.hi);
    return cmc_ivu_mk(cmc_i64min(cmc_i64min(p0, p1), cmc_i64min(p2, p3)),
                      cmc_i64max(cmc_i64max(p0, p1), cmc_i64max(p2, p3)));
  }
  const cmc_i64 m = cmc_i64max(cmc_abs(a.lo), cmc_abs(a.hi));
  return cmc_ivu_mk(-m, m);
}
CMC_DEV cmc_iv cmc_ivu_mod(cmc_iv a, cmc_iv b) {
  if (b.lo == b.hi) {
    const cmc_i64 c = b.lo;
    if (c == 0) return a;
    if (cmc_fdiv(a.lo, c) == cmc_fdiv(a.hi, c)) return cmc_ivu_mk(cmc_fmod(a.lo, c), cmc_fmod(a.hi, c));
    return c > 0 ? cmc_ivu_mk(0, c - 1) : cmc_ivu_mk(c + 1, 0);
  }
  if (b.lo > 0) return cmc_ivu_mk(0, b.hi - 1);
  if (b.hi < 0) return cmc_ivu_mk(b.lo + 1, 0);
  return cmc_ivu_mk(cmc_i64min(cmc_i64min(a.lo, b.lo + 1), 0), cmc_i64max(cmc_i64max(a.hi, b.hi - 1), 0));
}
// floor division: monotone in a for a fixed divisor; corners when the divisor keeps its sign;
// a divisor interval spanning 0 (x / 0 == 0, x / +-1 == +-x) gives [-max|a|, max|a|].
CMC_DEV cmc_iv cmc_iv_div(cmc_iv a, cmc_iv b) {
  if (cmc_iv_inf(a) || cmc_iv_inf(b)) return cmc_iv_top();
  const cmc_iv r = cmc_ivu_div(a, b);
  return cmc_iv_mk(r.lo, r.hi);
}
// floor remainder: exact when a stays inside one quotient block of a fixed divisor c, else
// the full residue range of c's sign; divisor intervals: the union over their values.
CMC_DEV cmc_iv cmc_iv_mod(cmc_iv a, cmc_iv b) {
  if (b.lo == b.hi && b.lo > -CMC_IV_BIG && b.lo < CMC_IV_BIG) {
    const cmc_i64 c = b.lo;
    if (c == 0) return a;
    if (!cmc_iv_inf(a) && cmc_fdiv(a.lo, c) == cmc_fdiv(a.hi, c))
      return cmc_iv_mk(cmc_fmod(a.lo, c), cmc_fmod(a.hi, c));
    return c > 0 ? cmc_iv_mk(0, c - 1) : cmc_iv_mk(c + 1, 0);
  }
  if (cmc_iv_inf(b)) return cmc_iv_top();
  if (b.lo > 0) return cmc_iv_mk(0, b.hi - 1);
  if (b.hi < 0) return cmc_iv_mk(b.lo + 1, 0);
  if (cmc_iv_inf(a)) return cmc_iv_top();
  return cmc_iv_mk(cmc_i64min(cmc_i64min(a.lo, b.lo + 1), 0), cmc_i64max(cmc_i64max(a.hi, b.hi - 1), 0));
}
// seg is non-decreasing in its argument (and constant beyond the int32 range, so saturated
// ends are fine); seg_start / seg_end over a range of segments j in [j0, j1]: the starts are
// sorted, the special values 0 (segment -1) and len (the last segment) are added explicitly.
CMC_DEV cmc_iv cmc_iv_seg(const int* s, int n, cmc_iv a) {
  cmc_iv r; r.lo = cmc_seg(s, n, a.lo); r.hi = cmc_seg(s, n, a.hi); return r;
}
CMC_DEV cmc_iv cmc_iv_seg_start(const int* s, int n, cmc_iv a) {
  const int j0 = cmc_seg(s, n, a.lo), j1 = cmc_seg(s, n, a.hi);
  if (j1 < 0) return cmc_iv_pt(0);
  cmc_iv r; r.lo = s[j0 < 0 ? 0 : j0]; r.hi = s[j1];
  if (j0 < 0) { r.lo = cmc_i64min(r.lo, 0); r.hi = cmc_i64max(r.hi, 0); }
  return r;
}
CMC_DEV cmc_iv cmc_iv_seg_end(const int* s, int n, int len, cmc_iv a) {
  const int j0 = cmc_seg(s, n, a.lo), j1 = cmc_seg(s, n, a.hi);
  if (j0 >= n - 1) return cmc_iv_pt(len);
  cmc_iv r; r.lo = s[j0 + 1]; r.hi = s[(j1 < n - 1 ? j1 : n - 2) + 1];
  if (j1 >= n - 1) { r.lo = cmc_i64min(r.lo, len); r.hi = cmc_i64max(r.hi, len); }
  return r;
}
// compile-time table t[0..n) with overall range [tmin, tmax]; an index outside the table is
// a lowering bug: clamp for memory safety.
CMC_DEV cmc_iv cmc_iv_tab(const int* t, int n, cmc_iv idx, int tmin, int tmax) {
  if (idx.lo == idx.hi && idx.lo > -CMC_IV_BIG && idx.lo < CMC_IV_BIG) {
    cmc_i64 i = idx.lo < 0 ? idx.lo + n : idx.lo;
    i = i < 0 ? 0 : (i >= n ? n - 1 : i);
    return cmc_iv_pt(t[i]);
  }
  return cmc_iv_mk(tmin, tmax);
}

// Comparisons: read an infinite lower end as -inf and an infinite upper end as +inf.
CMC_DEV cmc_i64 cmc_lo_ext(cmc_iv a) { return a.lo <= -CMC_IV_BIG ? -(CMC_IV_BIG * 2) : a.lo; }
CMC_DEV cmc_i64 cmc_hi_ext(cmc_iv a) { return a.hi >= CMC_IV_BIG ? (CMC_IV_BIG * 2) : a.hi; }
CMC_DEV cmc_tv cmc_tv_mk(bool may, bool must) { cmc_tv r; r.may = may; r.must = must; return r; }
CMC_DEV cmc_tv cmc_tv_const(bool v) { return cmc_tv_mk(v, v); }
CMC_DEV cmc_tv cmc_tv_lt(cmc_iv a, cmc_iv b) {
  return cmc_tv_mk(cmc_lo_ext(a) < cmc_hi_ext(b), cmc_hi_ext(a) < cmc_lo_ext(b));
}
CMC_DEV cmc_tv cmc_tv_le(cmc_iv a, cmc_iv b) {
  return cmc_tv_mk(cmc_lo_ext(a) <= cmc_hi_ext(b), cmc_hi_ext(a) <= cmc_lo_ext(b));
}
CMC_DEV cmc_tv cmc_tv_eq(cmc_iv a, cmc_iv b) {
  const bool may = cmc_lo_ext(a) <= cmc_hi_ext(b) && cmc_lo_ext(b) <= cmc_hi_ext(a);
  const bool must = !cmc_iv_inf(a) && a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  return cmc_tv_mk(may, must);
}
CMC_DEV cmc_tv cmc_tv_not(cmc_tv a) { return cmc_tv_mk(!a.must, !a.may); }
CMC_DEV cmc_tv cmc_tv_ne(cmc_iv a, cmc_iv b) { return cmc_tv_not(cmc_tv_eq(a, b)); }
CMC_DEV cmc_tv cmc_tv_and(cmc_tv a, cmc_tv b) { return cmc_tv_mk(a.may && b.may, a.must && b.must); }
CMC_DEV cmc_tv cmc_tv_or(cmc_tv a, cmc_tv b) { return cmc_tv_mk(a.may || b.may, a.must || b.must); }

CMC_DEV int cmc_clamp_key(cmc_i64 x, int len) { return x <= 0 ? 0 : (x >= len ? len : (int)x); }
// One term instance: guard truth over the rows, intervals of its lo and hi bounds.
CMC_DEV void cmc_term_out(int* out, cmc_tv g, cmc_iv lo, cmc_iv hi, bool exact, int len) {
  out[0] = 0; out[1] = 0; out[2] = 0; out[3] = 0;
  if (g.may) { out[0] = cmc_clamp_key(lo.lo, len); out[1] = cmc_clamp_key(hi.hi, len); }
  if (g.must && exact) { out[2] = cmc_clamp_key(lo.hi, len); out[3] = cmc_clamp_key(hi.lo, len); }
}
// Ranges of two row sets united (out, o: cmc_term_out's): the hull of the touched ranges, the
// intersection of the full ones.
CMC_DEV void cmc_term_unite(int* out, const int* o) {
  if (o[1] > o[0]) {
    if (out[1] > out[0]) {
      out[0] = out[0] < o[0] ? out[0] : o[0];
      out[1] = out[1] > o[1] ? out[1] : o[1];
    } else {
      out[0] = o[0]; out[1] = o[1];
    }
  }
  const int fa = out[2] > o[2] ? out[2] : o[2], fe = out[3] < o[3] ? out[3] : o[3];
  out[2] = fe > fa ? fa : 0;
  out[3] = fe > fa ? fe : 0;
}

// -------------------------------------------------------------------------------- tile plan
// Plan in shared memory, nt = H::kTerms term instances, bn = keys per tile:
//   term[4*nt] (from H::term) | run[2*nt] touched tiles [lo, hi) | full[2*nt] full tiles |
//   nrun | nfull
CMC_DEV int cmc_plan_ints(int nt) { return 8 * nt + 2; }
CMC_DEV int cmc_ceil_div(int a, int b) { return a / b + (a % b != 0); }  // a >= 0, no overflow

// A key bound of a span, clamped to [0, len].
CMC_DEV int cmc_key_clamp(cmc_i64 v, int len) { return v < 0 ? 0 : (v > len ? len : (int)v); }
CMC_DEV int cmc_key_clamp(int v, int len) { return v < 0 ? 0 : (v > len ? len : v); }
// Entry of a compile-time family table (numpy indexing for -n <= i < 0; clamped, as
// cmc_iv_tab, for memory safety only).
CMC_DEV int cmc_tab_at(const int* t, int n, cmc_i64 i) {
  i = i < 0 ? i + n : i;
  return t[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}
CMC_DEV int cmc_tab_at(const int* t, int n, int i) {
  i = i < 0 ? i + n : i;
  return t[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}
// The columns c(n, e) = 8 n + off + e (n < 16, e < 2) of one thread's row fragment in a
// 128-key tile (wgmma / mma.sync accumulator layout, off = 2 (lane % 4)) that lie in the
// tile-relative key interval [lo, hi): bit e * 16 + n.
CMC_DEV unsigned cmc_colmask32(int lo, int hi, int off) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > 128 ? 128 : hi;
  if (hi <= lo) return 0u;
  // c in [lo, hi)  <=>  ceil((lo - off - e) / 8) <= n < ceil((hi - off - e) / 8); x + 7 >= 0
  const int a0 = (lo - off + 7) >> 3, b0 = (hi - off + 7) >> 3;
  const int a1 = (lo - off + 6) >> 3, b1 = (hi - off + 6) >> 3;
  return ((1u << b0) - (1u << a0)) | (((1u << b1) - (1u << a1)) << 16);
}

#if defined(CMC_HOST)
CMC_DEV void cmc_atomic_min(int* w, int v) { *w = *w < v ? *w : v; }
CMC_DEV void cmc_atomic_max(int* w, int v) { *w = *w > v ? *w : v; }
#else
CMC_DEV void cmc_atomic_min(int* w, int v) { atomicMin(w, v); }
CMC_DEV void cmc_atomic_max(int* w, int v) { atomicMax(w, v); }
#endif
// Step 0: every term instance's ranges over rows [a, b] into p[4 nt] by threads tid < nth;
// sync() is their barrier, and p is complete after the last call. Hooks whose builders cut
// the rows at grid rows (H::kRowSplitParts, H::row_part; cmc/emit.py row_split_grid) take each
// (instance, part) on a thread of its own, united in shared memory: one part's latency, not
// their sum (natten_clamped's kv set-up: 17.6K cycles per CTA, 34K with the parts one after
// the other; 2026-12-06).
template <class H, class Sync>
CMC_DEV void cmc_plan_terms(const typename H::seq_t& s, int a, int b, int* p, int tid, int nth,
                            const Sync& sync) {
  constexpr int NT = H::kTerms;
  if constexpr (H::kRowSplitParts > 0) {
    constexpr int P = H::kRowSplitParts;
    for (int i = tid; i < NT; i += nth) {  // touched: min lo, max hi; full: max lo, min hi
      p[4 * i] = 0x7fffffff; p[4 * i + 1] = -0x7fffffff - 1;
      p[4 * i + 2] = -0x7fffffff - 1; p[4 * i + 3] = 0x7fffffff;
    }
    sync();
    for (int x = tid; x < NT * P; x += nth) {
      int pa, pb, o[4];
      if (!H::row_part(a, b, x % P, pa, pb)) continue;
      H::term(s, pa, pb, x / P, o);
      int* t = p + 4 * (x / P);
      if (o[1] > o[0]) { cmc_atomic_min(t, o[0]); cmc_atomic_max(t + 1, o[1]); }
      if (o[3] > o[2]) { cmc_atomic_max(t + 2, o[2]); cmc_atomic_min(t + 3, o[3]); }
      else cmc_atomic_max(t + 2, 0x7fffffff);
    }
    sync();
    for (int i = tid; i < NT; i += nth) {  // empty ranges as cmc_term_out writes them
      int* t = p + 4 * i;
      if (t[1] <= t[0]) { t[0] = 0; t[1] = 0; }
      if (t[3] <= t[2]) { t[2] = 0; t[3] = 0; }
    }
  } else {
    for (int i = tid; i < NT; i += nth) H::term(s, a, b, i, p + 4 * i);
  }
}

// Step 1 (one thread per term instance i, after every term is written): place i's touched
// tile range and full key range at their rank in start order (ties by index).
CMC_DEV void cmc_plan_place(int* p, int nt, int i, int bn) {
  const int* tm = p;
  int* run = p + 4 * nt;
  int* full = p + 6 * nt;
  const int a = tm[4 * i], e = tm[4 * i + 1];
  if (e > a) {
    const int ta = a / bn;
    int rank = 0;
    for (int j = 0; j < nt; ++j) {
      const int aj = tm[4 * j], ej = tm[4 * j + 1];
      if (ej > aj) { const int tj = aj / bn; rank += (tj < ta || (tj == ta && j < i)) ? 1 : 0; }
    }
    run[2 * rank] = ta;
    run[2 * rank + 1] = cmc_ceil_div(e, bn);
  }
  const int fa = tm[4 * i + 2], fe = tm[4 * i + 3];
  if (fe > fa) {
    int rank = 0;
    for (int j = 0; j < nt; ++j) {
      const int aj = tm[4 * j + 2], ej = tm[4 * j + 3];
      if (ej > aj) rank += (aj < fa || (aj == fa && j < i)) ? 1 : 0;
    }
    full[2 * rank] = fa;
    full[2 * rank + 1] = fe;
  }
}

// Step 2 (one thread): merge the sorted runs in place; full key ranges are merged first
// (a tile covered by two adjacent full ranges is full) and then shrunk to whole tiles.
CMC_DEV void cmc_plan_merge(int* p, int nt, int bn) {
  const int* tm = p;
  int* run = p + 4 * nt;
  int* full = p + 6 * nt;
  int n = 0, nf = 0;
  for (int i = 0; i < nt; ++i) {
    n += tm[4 * i + 1] > tm[4 * i] ? 1 : 0;
    nf += tm[4 * i + 3] > tm[4 * i + 2] ? 1 : 0;
  }
  int out = 0;
  for (int r = 0; r < n; ++r) {
    const int a = run[2 * r], e = run[2 * r + 1];
    if (out > 0 && a <= run[2 * out - 1]) {
      if (e > run[2 * out - 1]) run[2 * out - 1] = e;
    } else {
      run[2 * out] = a; run[2 * out + 1] = e; ++out;
    }
  }
  p[8 * nt] = out;
  out = 0;
  for (int r = 0; r < nf; ++r) {
    const int a = full[2 * r], e = full[2 * r + 1];
    if (out > 0 && a <= full[2 * out - 1]) {
      if (e > full[2 * out - 1]) full[2 * out - 1] = e;
    } else {
      full[2 * out] = a; full[2 * out + 1] = e; ++out;
    }
  }
  int outt = 0;
  for (int r = 0; r < out; ++r) {
    const int a = cmc_ceil_div(full[2 * r], bn), e = full[2 * r + 1] / bn;
    if (a < e) { full[2 * outt] = a; full[2 * outt + 1] = e; ++outt; }
  }
  p[8 * nt + 1] = outt;
}

// ------------------------------------------------------------------- patch tiling (sm90)
// The sm90 kernel's tiles when the hooks say kTiling == 1 (cmc/tiling.py): tokens before the
// grid origin O form linear tiles of 128, t = 0 .. nlin - 1, the last one partial when O is
// not a multiple of 128 (its tokens from O on are grid tokens of patches: cmc_patch_lim);
// the grid k = O + ky * W + kx is cut into patches of PH grid rows x PW tokens
// (PH * PW = 128), tile nlin + py * (W / PW) + px. Queries and keys are tiled alike. A tile
// is PH boxes of PW consecutive tokens (box b: grid row py * PH + b of a patch, tokens
// 128 t + b PW of a linear tile), which is how TMA loads it.
struct cmc_patch_geo {
  int O, W, PH, PW, nlin, ngx, nqt;
};
CMC_DEV cmc_patch_geo cmc_patch_geo_of(int len, int O, int W, int PH, int PW) {
  cmc_patch_geo g;
  g.O = O; g.W = W; g.PH = PH; g.PW = PW;
  g.nlin = cmc_ceil_div(len < O ? len : O, 128);
  g.ngx = W / PW;
  g.nqt = g.nlin + cmc_ceil_div(len > O ? cmc_ceil_div(len - O, W) : 0, PH) * g.ngx;
  return g;
}
// First token (sequence-relative) of box b of tile t; it may be >= len (box past the end).
CMC_DEV int cmc_patch_box(const cmc_patch_geo& g, int t, int b) {
  if (t < g.nlin) return t * 128 + b * g.PW;
  const int u = t - g.nlin, py = u / g.ngx, px = u - py * g.ngx;
  return g.O + (py * g.PH + b) * g.W + px * g.PW;
}
// The end of tile t's own tokens: len, or O for a linear tile when the grid begins inside it
// (its boxes still load 128 tokens; rows and keys from the limit on belong to other tiles).
CMC_DEV int cmc_patch_lim(const cmc_patch_geo& g, int t, int len) {
  return t < g.nlin && g.O < len ? g.O : len;
}
// The per-offset tile mask (class) of query patch qt against key patch j, or -1 when there
// is none: a linear tile on either side, a key patch not wholly below len, or an offset
// outside [dy_lo, dy_lo + dy_n) x [dx_lo, dx_lo + dx_n) (cmc/tiling.py patch_masks).
CMC_DEV int cmc_patch_mask_class(const cmc_patch_geo& g, int qt, int j, int len, int dy_lo,
                                 int dy_n, int dx_lo, int dx_n) {
  if (qt < g.nlin || j < g.nlin) return -1;
  const int u = j - g.nlin, ky = u / g.ngx, kx = u - ky * g.ngx;
  const int v = qt - g.nlin, qy = v / g.ngx, qx = v - qy * g.ngx;
  if (g.O + ((ky + 1) * g.PH - 1) * g.W + (kx + 1) * g.PW > len) return -1;
  const int dy = ky - qy - dy_lo, dx = kx - qx - dx_lo;
  if (dy < 0 || dy >= dy_n || dx < 0 || dx >= dx_n) return -1;
  return dy * dx_n + dx;
}
// Query patch qt is interior (cmc/tiling.py interior_patch_masks, ir.PatchInterior): patch
// row >= row_top, patch column in [col_lo, col_hi), and rows_below whole grid rows below it
// at this len, so its window is the one the mask classes were built from.
CMC_DEV bool cmc_patch_interior(const cmc_patch_geo& g, int qt, int len, int row_top,
                                int rows_below, int col_lo, int col_hi) {
  if (qt < g.nlin) return false;
  const int v = qt - g.nlin, py = v / g.ngx, px = v - py * g.ngx;
  return py >= row_top && px >= col_lo && px < col_hi &&
         g.O + ((py + 1) * g.PH + rows_below) * g.W <= len;
}
// The mask class of a patch pair under hooks H (-1: none): cmc_patch_mask_class, and for
// masks proved on interior query patches only (H::kMaskInterior), none for the others; with
// a class set per interior patch column (H::kMaskPerColumn), the query patch column's set.
template <class H>
CMC_DEV int cmc_patch_class_of(const cmc_patch_geo& g, int qt, int j, int len) {
  int c = cmc_patch_mask_class(g, qt, j, len, H::kMaskDyLo, H::kMaskDyN, H::kMaskDxLo,
                               H::kMaskDxN);
  if constexpr (H::kMaskInterior != 0) {
    if (!cmc_patch_interior(g, qt, len, H::kMaskRowTop, H::kMaskRowsBelow, H::kMaskColLo,
                            H::kMaskColHi))
      return -1;
    if constexpr (H::kMaskPerColumn != 0) {
      if (c >= 0) c += ((qt - g.nlin) % g.ngx - H::kMaskColLo) * (H::kMaskDyN * H::kMaskDxN);
    }
  }
  return c;
}
// How many of patch tile j's 128 columns have a token below len: a patch's columns are its
// tokens in order (patch row r, column x at r PW + x), so those below len are a prefix.
CMC_DEV int cmc_patch_keys_below(const cmc_patch_geo& g, int j, int len) {
  const int u = j - g.nlin, ky = u / g.ngx, kx = u - ky * g.ngx;
  const int base = g.O + ky * g.PH * g.W + kx * g.PW;
  if (base + (g.PH - 1) * g.W + g.PW <= len) return 128;
  const int d = len - base, r = d > 0 ? d / g.W : 0, x = d > 0 ? d - r * g.W : 0;
  return r * g.PW + (x < g.PW ? x : g.PW);
}
// The mask class of (query patch qt, key patch j) as cmc_patch_class_of, and also for a key
// patch cut by len (a sequence's last patch row) where the classes hold at every length (no
// interior rule: cmc/tiling.py patch_masks proves that no grid key's visibility from a grid
// query reads len, so the class's bits of the keys below len are theirs). The caller clears
// the columns from cmc_patch_keys_below on (cmc_patch_tile_mask), or has no key there
// (zero-filled rows that add nothing: the kv).
template <class H>
CMC_DEV int cmc_patch_class_cut(const cmc_patch_geo& g, int qt, int j, int len) {
  if constexpr (H::kMaskInterior != 0)
    return cmc_patch_class_of<H>(g, qt, j, len);
  else
    return cmc_patch_mask_class(g, qt, j, 0x3fffffff, H::kMaskDyLo, H::kMaskDyN, H::kMaskDxLo, H::kMaskDxN);
}
#if defined(CMC_HOST)
struct cmc_uint2 {
  unsigned x, y;
};
#define CMC_MASK_TABLE static const cmc_uint2
#else
typedef uint2 cmc_uint2;
#define CMC_MASK_TABLE static __device__ const cmc_uint2
#endif
// The tile mask of the patch pair (query patch qt, key patch j) for sm90 consumer thread th
// (class cmc_patch_class_cut; the columns from len on cleared, off = 2 (lane % 4)), false
// where the pair has no class.
template <class H>
CMC_DEV bool cmc_patch_tile_mask(const cmc_patch_geo& g, int qt, int j, int len, int th, int off, cmc_uint2& w) {
  const int c = cmc_patch_class_cut<H>(g, qt, j, len);
  if (c < 0) return false;
#if defined(CMC_HOST)
  w = H::patch_masks()[c * 256 + th];
#else
  w = __ldg(H::patch_masks() + c * 256 + th);
#endif
  if constexpr (H::kMaskInterior == 0) {  // (an interior class's key patch is below len)
    const int lim = cmc_patch_keys_below(g, j, len);
    if (lim < 128) {
      const unsigned cut = cmc_colmask32(0, lim, off);
      w.x &= cut;
      w.y &= cut;
    }
  }
  return true;
}
// Where tile offset dt (key tile - query tile) is in a per-offset table over [lo, lo + n)
// (cmc/ir.py OffsetMasks.index): the offsets past a periodic end (tile masks that repeat
// past some offset, cmc/periodic.py) reuse the table's first `below` or last `above` offsets
// (0: nothing visible past that end); false: nothing visible.
CMC_DEV bool cmc_offset_index(int dt, int lo, int n, int below, int above, int& d) {
  d = dt - lo;
  if (below > 0 && d < 0) d = below - 1 - (-1 - d) % below;
  if (above > 0 && d >= n) d = n - above + (d - n) % above;
  return static_cast<unsigned>(d) < static_cast<unsigned>(n);
}
// The tile mask of the linear tile pair (query tile qt, key tile j) for sm90 consumer
// thread th, from a per-offset table over the tile offsets [lo, lo + n) (cmc_offset_index),
// one block of n per query-tile phase qt % phases (cmc/tiling.py offset_masks,
// lattice_offset_masks; cmc/emit.py sm90_mask_words gives the order): nothing visible
// outside them, and a key tile that crosses len is cut there (off = 2 (lane % 4)).
CMC_DEV cmc_uint2 cmc_offset_tile_mask(const cmc_uint2* table, int lo, int n, int phases,
                                       int below, int above, int qt, int j, int th, int len,
                                       int off) {
  int d;
  const bool in = cmc_offset_index(j - qt, lo, n, below, above, d);
  const unsigned c = static_cast<unsigned>(qt % phases) * static_cast<unsigned>(n) +
                     static_cast<unsigned>(d);
  cmc_uint2 w = {0u, 0u};
#if defined(CMC_HOST)
  if (in) w = table[c * 256 + th];
#else
  if (in) w = __ldg(table + c * 256 + th);
#endif
  if (j * 128 + 128 > len) {
    const unsigned cut = cmc_colmask32(0, len - j * 128, off);
    w.x &= cut;
    w.y &= cut;
  }
  return w;
}
// The linear tile pair (query tile qt, key tile j) is in the band of a lattice proof
// (cmc/tiling.py lattice_offset_masks, ir.LinearBand): qt >= tile_top, tiles_below whole
// tiles below qt at this len, len <= max_len, key tile j wholly in the grid (j >= key_lo)
// and wholly below len; only then does the per-offset table give its mask (the others
// evaluate the spans).
CMC_DEV bool cmc_offset_band(int qt, int j, int len, int tile_top, int tiles_below,
                             int max_len, int key_lo) {
  return qt >= tile_top && (qt + 1 + tiles_below) * 128 <= len && len <= max_len &&
         j >= key_lo && j * 128 + 128 <= len;
}
#if defined(CMC_HOST)
CMC_DEV void cmc_or_word(unsigned* w, unsigned v) { *w |= v; }
#else
CMC_DEV void cmc_or_word(unsigned* w, unsigned v) { atomicOr(w, v); }
#endif
// Set bits [a, b) of a bit set (a < b).
CMC_DEV void cmc_bits_set(unsigned* bits, int a, int b) {
  for (int w = a >> 5; w <= (b - 1) >> 5; ++w) {
    const int lo = a > 32 * w ? a - 32 * w : 0, hi = b < 32 * w + 32 ? b - 32 * w : 32;
    const unsigned m = (hi == 32 ? ~0u : (1u << hi) - 1u) & ~((1u << lo) - 1u);
    cmc_or_word(bits + w, m);
  }
}
// Mark every tile holding a key of [lo, hi) (0 <= lo, hi <= len). Exact for keys inside one
// grid row; a range over several grid rows marks their whole patch rows (sound, coarse).
CMC_DEV void cmc_patch_mark(unsigned* bits, const cmc_patch_geo& g, int lo, int hi) {
  if (hi <= lo) return;
  if (lo < g.O) cmc_bits_set(bits, lo / 128, cmc_ceil_div(hi < g.O ? hi : g.O, 128));
  if (hi <= g.O) return;
  const int a = (lo > g.O ? lo : g.O) - g.O, e = hi - g.O;
  const int ya = a / g.W, yb = (e - 1) / g.W;
  if (ya == yb) {
    const int t = g.nlin + (ya / g.PH) * g.ngx;
    cmc_bits_set(bits, t + (a - ya * g.W) / g.PW, t + (e - 1 - yb * g.W) / g.PW + 1);
  } else {
    cmc_bits_set(bits, g.nlin + (ya / g.PH) * g.ngx, g.nlin + (yb / g.PH + 1) * g.ngx);
  }
}
// One item of a patch plan's hull-and-box loop (the forward's build_plan_patch, the
// backward kv's patch plan step): term i's ranges r4 over the tile's hull are its plan entry
// p[4 i ..]; those over a box, or a linear tile's hull (no boxes), mark the tiles they touch.
CMC_DEV void cmc_plan_patch_item(int* p, unsigned* touched, const cmc_patch_geo& g, int i, const int* r4,
                                 bool hull, bool boxes) {
  if (hull) {
    p[4 * i] = r4[0];
    p[4 * i + 1] = r4[1];
    p[4 * i + 2] = r4[2];
    p[4 * i + 3] = r4[3];
  }
  if (!hull || !boxes) cmc_patch_mark(touched, g, r4[0], r4[1]);
}
// Whether every key of tile t is below its limit (cmc_patch_lim) and inside one of the full
// ranges of the plan's terms (p[4 i + 2 .. 3], i < nt): then every pair of the tile is visible.
CMC_DEV bool cmc_patch_full(const cmc_patch_geo& g, const int* p, int nt, int len, int t) {
  const int lim = cmc_patch_lim(g, t, len);
  for (int b = 0; b < g.PH; ++b) {
    const int s = cmc_patch_box(g, t, b);
    if (s + g.PW > lim) return false;
    bool in = false;
    for (int i = 0; i < nt && !in; ++i) in = p[4 * i + 2] <= s && s + g.PW <= p[4 * i + 3];
    if (!in) return false;
  }
  return true;
}

// ========================================================================= part B: device
#if !defined(CMC_HOST)
namespace cmc_portable {

// (enums, not constexpr variables: those would each become a global in the cubin)
enum : int {
  kBM = 128,  // query rows per CTA
  kBN = 64    // keys per tile
};
// MT = m16 row tiles per warp: 128 / (16 * MT) warps. MT = 2 (4 warps x 32 rows, as in
// FlashAttention-2) halves the shared-memory reads of K and V per mma; MT = 1 (8 warps x 16
// rows) needs fewer registers.
template <int MT> struct Shape {
  enum : int { kWarps = kBM / (16 * MT), kThreads = 32 * kWarps, kRows = 16 * MT };
};

// Dynamic shared memory: Q tile (later the O staging area) | K x2 | V x2 | plan ints.
template <int D> struct Smem {
  enum : int {
    kQ = 0,
    kK = kBM * D * 2,
    kTile = kBN * D * 2,
    kV = kK + 2 * kTile,
    kPlan = kV + 2 * kTile
  };
};
template <int D, int NT> constexpr int smem_bytes() {
  return (Smem<D>::kPlan + (8 * NT + 2) * 4 + 15) / 16 * 16;
}

// Byte offset of 16-byte chunk c of row r in a [rows][D] bf16/fp16 tile: chunk XOR (r & 7)
// puts the 8 rows one ldmatrix phase reads (same logical chunk) in 8 distinct bank groups.
template <int D> CMC_DEV unsigned swz(int r, int c) {
  return (unsigned)(r * (D * 2) + ((c ^ (r & 7)) << 4));
}
// The hot loops read chunk 2*kk + b of rows r0 + 16*i (b in {0, 1}, r0 fixed per lane):
// swz = 16*i*rowbytes + (swz(r0, b) ^ (kk << 5)), because a row start (a multiple of the
// 128- or 256-byte row) never has the chunk bits set (4..6 or 4..7) and, as b < 2,
// (2kk + b) ^ x == (2kk) ^ (b ^ x). One LOP per k-step,
// the rest folds into the ldmatrix immediate, instead of a live register per address.
template <int D> CMC_DEV unsigned swz_step(unsigned pre, int kk) { return pre ^ (unsigned)(kk << 5); }

CMC_DEV unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
// 16-byte async copy; valid == false reads nothing and writes zeros (rows past len).
CMC_DEV void cp_async16(unsigned dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
CMC_DEV void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> CMC_DEV void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

CMC_DEV void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
CMC_DEV void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
// D[16x8] += A[16x16] * B[16x8], fp32 accumulate.
template <bool BF16> CMC_DEV void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  if constexpr (BF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// Two floats to one packed pair, round to nearest even; lo lands in the low 16 bits.
template <bool BF16> CMC_DEV unsigned pack2(float lo, float hi) {
  unsigned d;
  if constexpr (BF16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  }
  return d;
}
CMC_DEV float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x)); return y; }
CMC_DEV float lg2(float x) { float y; asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x)); return y; }
CMC_DEV float neg_inf() { return __int_as_float(0xff800000); }
// Max / sum over the 4 lanes of a quad (the threads holding one accumulator row).
CMC_DEV float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
CMC_DEV float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Issue the cp.async copies of key tile `tile` ([tile*64, tile*64+64) of the sequence) of K
// or V into the tile buffer at shared address dst; keys >= len are zero-filled.
template <int D, int NTHREADS>
CMC_DEV void load_kv(unsigned dst, const unsigned short* g, cmc_i64 stride_tok, int tile, int len,
                     int tid) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = tid; c < kBN * kChunks; c += NTHREADS) {
    const int r = c / kChunks, ch = c % kChunks;
    const int key = tile * kBN + r;
    const bool valid = key < len;
    const unsigned short* src = g + (cmc_i64)(valid ? key : 0) * stride_tok + ch * 8;
    cp_async16(dst + swz<D>(r, ch), src, valid);
  }
}

template <class H, bool BF16, int D, int MT>
CMC_DEV void fwd(const typename H::desc_t& desc) {
  static_assert(D == 64 || D == 128, "head dim");
  static_assert(MT == 1 || MT == 2, "m16 tiles per warp");
  constexpr int NT = H::kTerms;
  constexpr int kThreads = Shape<MT>::kThreads;
  constexpr int kRows = Shape<MT>::kRows;  // query rows per warp
  constexpr int kChunks = D / 8;           // 16-byte chunks per row
  constexpr int kKSteps = D / 16;          // k-steps of Q K^T
  constexpr int kDTiles = D / 8;           // n-tiles of P V
  // Q fragments live in registers when they fit (16 rows: D/4 registers per m16 tile);
  // otherwise they are re-read from shared memory for every key tile.
  constexpr bool kQRegs = MT * D <= 128;
  extern __shared__ __align__(128) unsigned char cmc_smem[];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = blockIdx.x * kBM;
  const typename H::seq_t seq = H::seq(desc, b);
  const int len = seq.len;
  if (q0 >= len) return;  // uniform over the CTA
  const cmc_i64 tok0 = seq.tok0;
  const int hkv = h / (desc.heads_q / desc.heads_kv);

  const unsigned sQ = smem_u32(cmc_smem + Smem<D>::kQ);
  const unsigned sK = smem_u32(cmc_smem + Smem<D>::kK);
  const unsigned sV = smem_u32(cmc_smem + Smem<D>::kV);
  int* plan = reinterpret_cast<int*>(cmc_smem + Smem<D>::kPlan);

  // Q tile: rows past len zero-filled (their results are never written).
  {
    const unsigned short* g =
        reinterpret_cast<const unsigned short*>(desc.q) + tok0 * desc.q_stride_tok + (cmc_i64)h * desc.q_stride_head;
#pragma unroll
    for (int c = tid; c < kBM * kChunks; c += kThreads) {
      const int r = c / kChunks, ch = c % kChunks;
      const bool valid = q0 + r < len;
      cp_async16(sQ + swz<D>(r, ch), g + (cmc_i64)(valid ? q0 + r : 0) * desc.q_stride_tok + ch * 8, valid);
    }
    cp_commit();
  }

  // Tile plan for rows [q0, min(q0 + 127, len - 1)], built while Q is in flight.
  {
    const int qa = q0, qb = (len - 1 - q0 < kBM - 1) ? len - 1 : q0 + kBM - 1;
    cmc_plan_terms<H>(seq, qa, qb, plan, tid, kThreads, [] { __syncthreads(); });
    __syncthreads();
    for (int i = tid; i < NT; i += kThreads) cmc_plan_place(plan, NT, i, kBN);
    __syncthreads();
    if (tid == 0) cmc_plan_merge(plan, NT, kBN);
    __syncthreads();
  }
  const int* run = plan + 4 * NT;
  const int* full = plan + 6 * NT;
  const int nrun = plan[8 * NT], nfull = plan[8 * NT + 1];

  const unsigned short* kg =
      reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok + (cmc_i64)hkv * desc.k_stride_head;
  const unsigned short* vg =
      reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok + (cmc_i64)hkv * desc.v_stride_head;

  int j = nrun > 0 ? run[0] : 0;  // current key tile
  if (nrun > 0) {
    load_kv<D, kThreads>(sK, kg, desc.k_stride_tok, j, len, tid);
    cp_commit();
    load_kv<D, kThreads>(sV, vg, desc.v_stride_tok, j, len, tid);
    cp_commit();
  } else {
    cp_commit();  // empty groups keep the wait counts below uniform
    cp_commit();
  }

  cp_wait<2>();  // Q has landed
  __syncthreads();
  // A operand of Q K^T: rows warp*kRows + mt*16 .. +15; ldmatrix x4 = one 16x16 block.
  const int wrow = warp * kRows;
  // ldmatrix row addresses (see swz_step): Q A operand, K B operand, V B operand (.trans).
  const unsigned qpre = swz<D>(wrow + (lane & 15), lane >> 4);
  const unsigned kpre = swz<D>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const unsigned vpre = swz<D>(lane & 15, lane >> 4);
  unsigned qf[kQRegs ? MT : 1][kQRegs ? kKSteps : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
        ldsm_x4(sQ + mt * 16 * (D * 2) + swz_step<D>(qpre, kk),
                qf[mt][kk][0], qf[mt][kk][1], qf[mt][kk][2], qf[mt][kk][3]);
  }

  // This thread's rows (mma C layout): for m-tile mt, rows wrow + mt*16 + lane/4 and +8.
  const int row0 = q0 + wrow + (lane >> 2);
  typename H::row_t rc[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    rc[mt][0] = H::row(seq, row0 + mt * 16);
    rc[mt][1] = H::row(seq, row0 + mt * 16 + 8);
  }

  float o[MT][kDTiles][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.f;
    m[mt][0] = m[mt][1] = neg_inf();
    l[mt][0] = l[mt][1] = 0.f;
  }
  const float sl2 = desc.scale_log2;

  int r = 0, f = 0, buf = 0;
  while (nrun > 0) {  // leaves by the break after the last tile
    // Next non-empty tile (the plan's runs are sorted and disjoint), -1 after the last.
    int jn, rn = r;
    if (j + 1 < run[2 * r + 1]) {
      jn = j + 1;
    } else {
      rn = r + 1;
      jn = rn < nrun ? run[2 * rn] : -1;
    }

    cp_wait<1>();     // K(j) has landed (V(j) may still be in flight)
    __syncthreads();  // ... for every thread; and everyone is done with buffers buf ^ 1
    if (jn >= 0) load_kv<D, kThreads>(sK + (buf ^ 1) * Smem<D>::kTile, kg, desc.k_stride_tok, jn, len, tid);
    cp_commit();
    if (jn >= 0) load_kv<D, kThreads>(sV + (buf ^ 1) * Smem<D>::kTile, vg, desc.v_stride_tok, jn, len, tid);
    cp_commit();

    // S = Q K^T for kRows rows x 64 keys per warp; each K fragment feeds MT m-tiles.
    float s[MT][8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
    const unsigned kb = sK + buf * Smem<D>::kTile;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      unsigned qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kQRegs) {
          qa[mt][0] = qf[mt][kk][0]; qa[mt][1] = qf[mt][kk][1];
          qa[mt][2] = qf[mt][kk][2]; qa[mt][3] = qf[mt][kk][3];
        } else {
          ldsm_x4(sQ + mt * 16 * (D * 2) + swz_step<D>(qpre, kk),
                  qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
        }
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        unsigned b0, b1, b2, b3;
        ldsm_x4(kb + np * 16 * (D * 2) + swz_step<D>(kpre, kk), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma<BF16>(s[mt][2 * np], qa[mt], b0, b1);
          mma<BF16>(s[mt][2 * np + 1], qa[mt], b2, b3);
        }
      }
    }

    // Mask: nothing on full tiles; visible(q, k) && k < len on every other walked tile.
    while (f < nfull && full[2 * f + 1] <= j) ++f;
    const bool is_full = f < nfull && full[2 * f] <= j;
    if (!is_full) {
      const int kbase = j * kBN + 2 * (lane & 3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int k = kbase + n * 8 + e;
            const bool in = k < len;
            if (!(in && H::visible(seq, rc[mt][0], k))) s[mt][n][e] = neg_inf();
            if (!(in && H::visible(seq, rc[mt][1], k))) s[mt][n][2 + e] = neg_inf();
          }
        }
      }
    }

    // Online softmax in exp2 units; a row whose max is still -inf uses 0 as its offset so
    // nothing computes (-inf) - (-inf). P becomes the A operand of P V (k-step kk = keys
    // 16kk .. 16kk+15), packed to 16 bits.
    unsigned pa[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx0 = m[mt][0], mx1 = m[mt][1];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        mx0 = fmaxf(mx0, fmaxf(s[mt][n][0], s[mt][n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[mt][n][2], s[mt][n][3]));
      }
      mx0 = quad_max(mx0);
      mx1 = quad_max(mx1);
      const float ms0 = mx0 == neg_inf() ? 0.f : mx0 * sl2;
      const float ms1 = mx1 == neg_inf() ? 0.f : mx1 * sl2;
      const float c0 = ex2(m[mt][0] * sl2 - ms0), c1 = ex2(m[mt][1] * sl2 - ms1);
      m[mt][0] = mx0;
      m[mt][1] = mx1;
      float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const float p0 = ex2(fmaf(s[mt][n][0], sl2, -ms0)), p1 = ex2(fmaf(s[mt][n][1], sl2, -ms0));
        const float p2 = ex2(fmaf(s[mt][n][2], sl2, -ms1)), p3 = ex2(fmaf(s[mt][n][3], sl2, -ms1));
        ps0 += p0 + p1;
        ps1 += p2 + p3;
        pa[mt][n >> 1][(n & 1) * 2 + 0] = pack2<BF16>(p0, p1);
        pa[mt][n >> 1][(n & 1) * 2 + 1] = pack2<BF16>(p2, p3);
      }
      l[mt][0] = l[mt][0] * c0 + ps0;
      l[mt][1] = l[mt][1] * c1 + ps1;
#pragma unroll
      for (int d = 0; d < kDTiles; ++d) {
        o[mt][d][0] *= c0; o[mt][d][1] *= c0;
        o[mt][d][2] *= c1; o[mt][d][3] *= c1;
      }
    }

    cp_wait<2>();     // V(j) has landed (K, V of tile jn may still be in flight)
    __syncthreads();
    const unsigned vb = sV + buf * Smem<D>::kTile;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        unsigned b0, b1, b2, b3;
        ldsm_x4_t(vb + kk * 16 * (D * 2) + swz_step<D>(vpre, dp), b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma<BF16>(o[mt][2 * dp], pa[mt][kk], b0, b1);
          mma<BF16>(o[mt][2 * dp + 1], pa[mt][kk], b2, b3);
        }
      }
    }

    buf ^= 1;
    if (jn < 0) break;
    j = jn;
    r = rn;
  }
  cp_wait<0>();

  // Epilogue: finish the row sums across the quad, normalise, LSE, store O through shared
  // memory (this warp's own Q rows) so global stores are 16-byte and row-contiguous.
  float* lse = desc.lse != 0
      ? reinterpret_cast<float*>(desc.lse) + (cmc_i64)h * desc.lse_stride_head + tok0 : nullptr;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float l0 = l[mt][0], l1 = l[mt][1];
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f;
    const float inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    const int qr = row0 + mt * 16;
    if (lse != nullptr && (lane & 3) == 0) {
      constexpr float kLn2 = 0.6931471805599453f;
      if (qr < len) lse[qr] = l0 > 0.f ? (m[mt][0] * sl2 + lg2(l0)) * kLn2 : neg_inf();
      if (qr + 8 < len) lse[qr + 8] = l1 > 0.f ? (m[mt][1] * sl2 + lg2(l1)) * kLn2 : neg_inf();
    }
    const int wr = wrow + mt * 16 + (lane >> 2);  // row inside the CTA tile
    const unsigned off = (unsigned)((lane & 3) * 4);
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
      const unsigned w0 = pack2<BF16>(o[mt][d][0] * inv0, o[mt][d][1] * inv0);
      const unsigned w1 = pack2<BF16>(o[mt][d][2] * inv1, o[mt][d][3] * inv1);
      *reinterpret_cast<unsigned*>(cmc_smem + swz<D>(wr, d) + off) = w0;
      *reinterpret_cast<unsigned*>(cmc_smem + swz<D>(wr + 8, d) + off) = w1;
    }
  }
  __syncwarp();
  unsigned short* og =
      reinterpret_cast<unsigned short*>(desc.o) + tok0 * desc.o_stride_tok + (cmc_i64)h * desc.o_stride_head;
#pragma unroll
  for (int c = lane; c < kRows * kChunks; c += 32) {
    const int rr = c / kChunks, ch = c % kChunks;
    const int qrow = q0 + wrow + rr;
    if (qrow < len) {
      const uint4 v = *reinterpret_cast<const uint4*>(cmc_smem + swz<D>(wrow + rr, ch));
      *reinterpret_cast<uint4*>(og + (cmc_i64)qrow * desc.o_stride_tok + ch * 8) = v;
    }
  }
}

}  // namespace cmc_portable
#endif  // !CMC_HOST
