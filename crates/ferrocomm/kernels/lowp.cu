// ferrocomm low-precision collectives: block-scaled FP8 (E4M3, E5M2) or INT8 codes in the
// staging buffers, f32 arithmetic. Appended after all_reduce.cu in the f32/f16/bf16 modules; uses
// its Args, T, Ty<T>, call_epoch and end_call, and after collectives.cu, whose payload-barrier
// words (bar_word, wait_word) carry every call's signature.
//
// Wire layout and rounding are those of crates/ferrocomm/src/quant (tests compare bytes):
//   block i of n elements = record at byte i*(4+B): [f32 scale][min(B, n-i*B) codes]
//   scale = absmax / M (absmax = integer max of the bits & 0x7fffffff), NaN when absmax is not
//   finite (codes 0), one ulp lower when scale*M overflows; codes 0 when scale == 0;
//   code = cvt.rn.satfinite(x / scale) with x / scale correctly rounded (lp_quot); INT8 = cvt.rni
//   of the clamped quotient. Decode = f32(code) * scale; sums in rank order 0..n-1, starting from
//   rank 0's decoded value. Every multiply/add/divide is an explicit _rn intrinsic: NVRTC contracts
//   a*b+c into an FMA by default, which the CPU codec does not do.
//
// Work split: a warp handles a tile of TILE = max(B, 128) elements, 4 per lane. For B < 128 a
// tile holds 128/B blocks and the absmax reduction is segmented over B/4 lanes. Tile t of any
// part or stripe is always handled by global warp t mod W, so the CTA that reads a tile after the
// per-CTA barrier is the CTA that wrote it on every rank (the barrier covers exactly that data).

#define LP_E4M3 0
#define LP_E5M2 1
#define LP_INT8 2
#define LP_ANY 3  // a template's format argument: the format is read at run time

#define LP_WARPS 16  // warps per CTA (512 threads)

struct Lp {
    u64 in_stride;   // elements between input parts (multi-part modes)
    u64 out_stride;  // elements between output parts
    u64 region;      // staging bytes between encoded parts (multiple of 16)
    u64 bar_off;     // offset of the payload-barrier words (CArgs.bar_off)
    u32 block;       // B
    u32 format;      // LP_E4M3 / LP_E5M2 / LP_INT8
    u32 nin;         // parts encoded by every rank (1 or world)
    u32 reduce;      // 1: sum the parts of all ranks into output part 0; 0: rank r -> part r
    u32 push;        // one-shot: 1 = records into the receivers' staging, 0 = into the sender's
    u32 sig;         // signature of the call (equal on every rank that makes the same call)
    u32 v;           // all-to-all-v (two ranks): part p's count and place below, not strides
    u32 split;       // push (one part, or the all-to-all at two ranks): odd groups stay in the
                     // sender's staging, at its slot, and the receivers pull them
    u64 scount[2];   // v: elements sent to rank p, from input element sdispl[p]
    u64 sdispl[2];
    u64 rcount[2];   // v: elements received from rank p, at output element rdispl[p]
    u64 rdispl[2];
};

// Entry p (0 or 1) of an all-to-all-v array, without indexing the parameter space (an indexed
// parameter array is copied to the stack).
__device__ __forceinline__ u64 lp_v(const u64 (&x)[2], u32 p) { return p ? x[1] : x[0]; }

// Block b meets block b of every rank at barrier `w` (0 or 1) on the collectives' payload-barrier
// words, each carrying this call's signature: a rank whose call differs (count, dtype, format,
// block size, kind, or another collective at the same step) is reported by block 0 (ERR_MISMATCH)
// and nobody reads what it sent. Rule 1 as in block_barrier: bar.sync orders the block's staging
// stores (remote ones included) before the system-scope release, which is cumulative; the
// acquire makes the peers' stores visible to the whole block after the second bar.sync.
__device__ bool lp_meet(const Args& a, const Lp& l, u32 e, u64 t0, u32 w) {
    __syncthreads();
    bool ok = true;
    if (threadIdx.x < a.world) {
        u32 p = threadIdx.x;
        CArgs c;  // bar_word reads bar_off only
        c.bar_off = l.bar_off;
        st_release_sys64(bar_word(a, c, p, e, a.rank, w), ((u64)e << 32) | l.sig);
        u32 sig = 0;
        ok = wait_word(a, bar_word(a, c, a.rank, e, p, w), e, p, 10 + w, t0, &sig);
        if (ok && sig != l.sig) {
            if (blockIdx.x == 0) report_error(a, ERR_MISMATCH, p, sig);
            ok = false;
        }
    }
    return __syncthreads_and(ok) != 0;
}

__device__ __forceinline__ float lp_max(u32 f) {
    return f == LP_E4M3 ? 448.0f : (f == LP_E5M2 ? 57344.0f : 127.0f);
}

// log2 of the block size B, a power of two (quant::Codec::new checks it): the hot loops take a
// record's index and a code's place in it with shifts and masks instead of integer divisions.
__device__ __forceinline__ u32 lp_log2(u32 B) { return __ffs(B) - 1; }

// Scale of a block whose absmax has the bits `m` (see the header).
__device__ __forceinline__ float lp_scale(u32 m, u32 fmt) {
    if (m >= 0x7f800000u) return __uint_as_float(0x7fc00000u);
    float mx = lp_max(fmt);
    float s = __fdiv_rn(__uint_as_float(m), mx);
    if (isinf(__fmul_rn(s, mx))) s = __uint_as_float(__float_as_uint(s) - 1);
    return s;
}

// Scales from which lp_quot's reciprocal multiply gives the division's codes (see there).
#define LP_RCP_MIN 0x1p-64f

// The reciprocal of a block's scale for lp_quot, or 0 where the division is needed: scales
// under LP_RCP_MIN (and zero or NaN scales, whose codes are 0 without a quotient).
__device__ __forceinline__ float lp_recip(float s) {
    return s >= LP_RCP_MIN && !isinf(s) ? __frcp_rn(s) : 0.0f;
}

// x / s correctly rounded, from y = 1/s correctly rounded (lp_recip), in three instructions
// instead of the division's ten and its slow-path branch: q = x*y is within an ulp of x/s, the
// remainder x - q*s is exact (FMA), and q + remainder*y rounds to x/s (Markstein's theorem).
// The sign of x is put back on a zero quotient (x = -0 or an underflowing negative x: the
// division gives -0, whose E4M3/E5M2 code is 0x80). The remainder is exact, so the theorem
// holds, for every scale from LP_RCP_MIN and every x whose quotient can round to a nonzero code
// (|x/s| >= 2^-17); smaller quotients give code 0 either way.
// quant::codec::tests::reciprocal_quotient_codes checks the codes against the division's.
__device__ __forceinline__ float lp_quot(float x, float s, float y) {
    float q = __fmul_rn(x, y);
    float r = __fmaf_rn(-q, s, x);
    q = __fmaf_rn(r, y, q);
    return __uint_as_float(__float_as_uint(q) | (__float_as_uint(x) & 0x80000000u));
}

// Four codes of the quotients q[0..4] (x / s), packed little endian (q[0] in the low byte).
__device__ __forceinline__ u32 lp_pack4(const float* q, u32 fmt) {
    u32 w;
    if (fmt == LP_E4M3) {
        u16 a, b;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(a) : "f"(q[1]), "f"(q[0]));
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(b) : "f"(q[3]), "f"(q[2]));
        asm("mov.b32 %0, {%1, %2};" : "=r"(w) : "h"(a), "h"(b));
    } else if (fmt == LP_E5M2) {
        u16 a, b;
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(a) : "f"(q[1]), "f"(q[0]));
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(b) : "f"(q[3]), "f"(q[2]));
        asm("mov.b32 %0, {%1, %2};" : "=r"(w) : "h"(a), "h"(b));
    } else {
        u32 c[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float v = fminf(fmaxf(q[i], -127.0f), 127.0f);
            int r;
            asm("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(v));
            c[i] = (u32)r & 0xff;
        }
        w = c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24);
    }
    return w;
}

// The quotients x[0..N] / s into q, or false for a zero or NaN scale (whose codes are 0);
// y = lp_recip(s). One branch for the common case, a scale with its reciprocal.
template <int N>
__device__ __forceinline__ bool lp_quotients(const float* x, float s, float y, float* q) {
    if (y != 0.0f) {  // y != 0: s is finite and at least LP_RCP_MIN (lp_recip)
#pragma unroll
        for (int i = 0; i < N; i++) q[i] = lp_quot(x[i], s, y);
        return true;
    }
    if (!(s > 0.0f) || isinf(s)) return false;
#pragma unroll
    for (int i = 0; i < N; i++) q[i] = __fdiv_rn(x[i], s);
    return true;
}

// Four codes of x[0..4] / s, packed little endian (x[0] in the low byte); y = lp_recip(s).
__device__ __forceinline__ u32 lp_encode4(const float* x, float s, float y, u32 fmt) {
    float q[4];
    return lp_quotients<4>(x, s, y, q) ? lp_pack4(q, fmt) : 0;
}

// The eight codes of x[0..8] / s into w[0..2], as two lp_encode4 calls give them: for a format
// known at compile time with one test of the scale for the eight; with LP_ANY (`fmt` read at
// run time) by lp_encode4.
template <u32 FMT>
__device__ __forceinline__ void lp_encode8(const float* x, float s, float y, u32 fmt, u32* w) {
    if (FMT == LP_ANY) {
        w[0] = lp_encode4(x, s, y, fmt);
        w[1] = lp_encode4(x + 4, s, y, fmt);
        return;
    }
    float q[8];
    bool coded = lp_quotients<8>(x, s, y, q);
    w[0] = coded ? lp_pack4(q, FMT) : 0;
    w[1] = coded ? lp_pack4(q + 4, FMT) : 0;
}

// f32 values of the four codes of `w` (byte k -> v[k]). The FP8 codes go to f16 two at a time
// (E4M3 by one conversion per pair, E5M2 is the top byte of an f16), then to f32; every step is
// exact.
__device__ __forceinline__ void lp_code_values4(u32 w, u32 fmt, float* v) {
    if (fmt == LP_INT8) {
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = (float)(int)(signed char)(w >> (8 * k));
        return;
    }
    u32 h[2];
    if (fmt == LP_E5M2) {
        h[0] = __byte_perm(w, 0, 0x1404);  // f16 pair: codes 0 and 1 as the top bytes
        h[1] = __byte_perm(w, 0, 0x3424);  // codes 2 and 3
    } else {
        u16 lo = (u16)(w & 0xffff), hi = (u16)(w >> 16);
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h[0]) : "h"(lo));
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h[1]) : "h"(hi));
    }
#pragma unroll
    for (int p = 0; p < 2; p++) {
        u16 a = (u16)(h[p] & 0xffff), b = (u16)(h[p] >> 16);
        asm("cvt.f32.f16 %0, %1;" : "=f"(v[2 * p]) : "h"(a));
        asm("cvt.f32.f16 %0, %1;" : "=f"(v[2 * p + 1]) : "h"(b));
    }
}

// A record's 4-byte word (records are 4-byte aligned): all_reduce.cu's volatile load.
__device__ __forceinline__ u32 ld_u32_vol(const u8* p) { return ld_volatile_u32((const u32*)p); }
__device__ __forceinline__ u32 ld_u8_vol(const u8* p) {
    u16 v;
    asm volatile("ld.volatile.global.u8 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return v;
}

// Four input elements at e0 as f32 (zeros past n).
__device__ __forceinline__ void lp_load_in(const T* in, u64 e0, u64 n, bool vec, float* x) {
    if (vec && e0 + 4 <= n) {
        if (sizeof(T) == 4) {
            uint4 u = *(const uint4*)(in + e0);
            x[0] = __uint_as_float(u.x);
            x[1] = __uint_as_float(u.y);
            x[2] = __uint_as_float(u.z);
            x[3] = __uint_as_float(u.w);
        } else {
            union { uint2 u; T e[4]; } v;
            v.u = *(const uint2*)(in + e0);
#pragma unroll
            for (int i = 0; i < 4; i++) x[i] = (float)Ty<T>::to_acc(v.e[i]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++)
            x[i] = (e0 + i < n) ? (float)Ty<T>::to_acc(in[e0 + i]) : 0.0f;
    }
}

__device__ __forceinline__ void lp_store_out(T* out, u64 e0, u64 n, bool vec, const float* x) {
    if (vec && e0 + 4 <= n) {
        if (sizeof(T) == 4) {
            *(uint4*)(out + e0) = make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]),
                                             __float_as_uint(x[2]), __float_as_uint(x[3]));
        } else {
            union { uint2 u; T e[4]; } v;
#pragma unroll
            for (int i = 0; i < 4; i++) v.e[i] = Ty<T>::from_acc(x[i]);
            *(uint2*)(out + e0) = v.u;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (e0 + i < n) out[e0 + i] = Ty<T>::from_acc(x[i]);
    }
}

#define LP_PIECES (sizeof(T) == 4 ? 2 : 1)  // 16-byte pieces of a lane's eight elements

// Whether a lane's eight elements at e0 come as whole 16-byte pieces.
__device__ __forceinline__ bool lp_whole(bool vec, u64 e0, u64 n) { return vec && e0 + 8 <= n; }

// The 16-byte pieces of elements e0..e0+8 (a whole run, see lp_whole), as loaded.
__device__ __forceinline__ void lp_load_pieces(const T* in, u64 e0, uint4* r) {
#pragma unroll
    for (int p = 0; p < LP_PIECES; p++) r[p] = *(const uint4*)(in + e0 + 4 * p);
}

// The eight elements of those pieces as f32.
__device__ __forceinline__ void lp_widen8(const uint4* r, float* x) {
    if (sizeof(T) == 4) {
        const u32* u = (const u32*)r;
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = __uint_as_float(u[i]);
    } else {
        union { uint4 u; T e[8]; } v;
        v.u = r[0];
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = (float)Ty<T>::to_acc(v.e[i]);
    }
}

// Eight input elements at e0 as f32 (zeros past n): one 16-byte load for 2-byte types, two for
// f32, when the whole run is inside and the base is 16-byte aligned (e0 is a multiple of 8).
__device__ __forceinline__ void lp_load_in8(const T* in, u64 e0, u64 n, bool vec, float* x) {
    if (lp_whole(vec, e0, n)) {
        uint4 r[LP_PIECES];
        lp_load_pieces(in, e0, r);
        lp_widen8(r, x);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = (e0 + i < n) ? (float)Ty<T>::to_acc(in[e0 + i]) : 0.0f;
    }
}

__device__ __forceinline__ void lp_store_out8(T* out, u64 e0, u64 n, bool vec, const float* x) {
    if (vec && e0 + 8 <= n) {
        if (sizeof(T) == 4) {
            *(uint4*)(out + e0) = make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]),
                                             __float_as_uint(x[2]), __float_as_uint(x[3]));
            *(uint4*)(out + e0 + 4) = make_uint4(__float_as_uint(x[4]), __float_as_uint(x[5]),
                                                 __float_as_uint(x[6]), __float_as_uint(x[7]));
        } else {
            union { uint4 u; T e[8]; } v;
#pragma unroll
            for (int i = 0; i < 8; i++) v.e[i] = Ty<T>::from_acc(x[i]);
            *(uint4*)(out + e0) = v.u;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (e0 + i < n) out[e0 + i] = Ty<T>::from_acc(x[i]);
    }
}

// Raw record words of elements e0..e0+4 of an encoding of n elements: the scale and the codes.
__device__ __forceinline__ void lp_load_raw(const u8* enc, u64 e0, u64 n, u32 B, float& s, u32& w) {
    const u8* rec = enc + (e0 >> lp_log2(B)) * (u64)(4 + B);
    u32 j = (u32)e0 & (B - 1);
    s = __uint_as_float(ld_u32_vol(rec));
    if (e0 + 4 <= n) {
        w = ld_u32_vol(rec + 4 + j);
    } else {
        w = 0;
        for (u32 i = 0; i < 4; i++)
            if (e0 + i < n) w |= ld_u8_vol(rec + 4 + j + i) << (8 * i);
    }
}

// x[i] (+)= decoded element e0+i.
__device__ __forceinline__ void lp_decode_into(float s, u32 w, u32 fmt, bool first, float* x) {
    float c[4];
    lp_code_values4(w, fmt, c);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v = __fmul_rn(c[i], s);
        x[i] = first ? v : __fadd_rn(x[i], v);
    }
}

// Sum (in rank order) of the decoded elements e0..e0+4 of `k` encodings (k = 1: plain decode),
// then the Avg division. Encodings: base[r] + off for r < k.
__device__ __forceinline__ void lp_sum4(const Args& a, const Lp& l, const u64* base, u32 k,
                                        u64 off, u64 e0, u64 n, float* x) {
    float s[FC_MAX_RANKS];
    u32 w[FC_MAX_RANKS];
    // All loads first (peers' memory: latency), then the arithmetic in rank order (rule 5).
#pragma unroll
    for (u32 r = 0; r < FC_MAX_RANKS; r++)
        if (r < k) lp_load_raw((const u8*)(base[r] + off), e0, n, l.block, s[r], w[r]);
#pragma unroll
    for (u32 r = 0; r < FC_MAX_RANKS; r++)
        if (r < k) lp_decode_into(s[r], w[r], l.format, r == 0, x);
    if (a.has_div) {
#pragma unroll
        for (int i = 0; i < 4; i++) x[i] = __fdiv_rn(x[i], a.post_div);
    }
}

// Warp-wide max of m over segments of `g` lanes (g a power of two <= 32).
__device__ __forceinline__ u32 seg_max(u32 m, u32 g) {
    for (u32 o = 1; o < g; o <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

__device__ __forceinline__ u32 absbits4(const float* x) {
    u32 m = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) m = max(m, __float_as_uint(x[i]) & 0x7fffffffu);
    return m;
}

// Stores the codes (and, for a block's first lane, the scale) of elements e0..e0+4.
__device__ __forceinline__ void lp_store_codes(u8* enc, u64 e0, u64 n, u32 B, float s,
                                               const float* x, u32 fmt, bool scale) {
    if (e0 >= n) return;
    u8* rec = enc + (e0 >> lp_log2(B)) * (u64)(4 + B);
    u32 j = (u32)e0 & (B - 1);
    if (scale && j == 0) *(float*)rec = s;
    u32 w = lp_encode4(x, s, lp_recip(s), fmt);
    if (e0 + 4 <= n) {
        *(u32*)(rec + 4 + j) = w;
    } else {
        for (u32 i = 0; i < 4; i++)
            if (e0 + i < n) rec[4 + j + i] = (u8)(w >> (8 * i));
    }
}

// Source of the values to quantize: the user's input, or the rank-ordered sum of k encodings.
struct SrcIn {
    const T* in;
    bool vec;
    __device__ __forceinline__ void get(const Args&, const Lp&, u64 e0, u64 n, float* x) const {
        lp_load_in(in, e0, n, vec, x);
    }
};
struct SrcSum {
    const u64* base;
    u32 k;
    u64 off;
    __device__ __forceinline__ void get(const Args& a, const Lp& l, u64 e0, u64 n, float* x) const {
        if (e0 >= n) {
            x[0] = x[1] = x[2] = x[3] = 0.0f;
            return;
        }
        lp_sum4(a, l, base, k, off, e0, n, x);
    }
};

// Quantizes tile `t` (elements t*TILE ..) of a part of n elements into the encoding `enc`.
// The whole warp calls it. For B > 128 the source is read twice (absmax, then codes), which
// keeps registers bounded; both reads give the same values.
template <typename Src>
__device__ __forceinline__ void lp_quant_tile(const Args& a, const Lp& l, const Src& src, u64 t,
                                              u64 n, u8* enc, u32 lane) {
    u32 B = l.block;
    if (B <= 128) {
        u64 e0 = t * 128 + lane * 4;
        float x[4];
        src.get(a, l, e0, n, x);
        u32 m = seg_max(absbits4(x), B / 4);
        float s = lp_scale(m, l.format);
        lp_store_codes(enc, e0, n, B, s, x, l.format, true);
    } else {
        u64 base = t * (u64)B;
        u32 m = 0;
        for (u32 i = 0; i < B; i += 128) {
            float x[4];
            src.get(a, l, base + i + lane * 4, n, x);
            m = max(m, absbits4(x));
        }
        float s = lp_scale(seg_max(m, 32), l.format);
        for (u32 i = 0; i < B; i += 128) {
            float x[4];
            u64 e0 = base + i + lane * 4;
            src.get(a, l, e0, n, x);
            lp_store_codes(enc, e0, n, B, s, x, l.format, false);
        }
        // The scale goes last: the two-shot owner re-reads its own record (scale included)
        // while it rewrites the codes in place.
        __syncwarp();
        if (lane == 0 && base < n) *(float*)(enc + t * (u64)(4 + B)) = s;
    }
}

// Decodes tile t (sum over k encodings) into out[0..n).
__device__ __forceinline__ void lp_dequant_tile(const Args& a, const Lp& l, const u64* base,
                                                u32 k, u64 off, u64 t, u64 n, T* out, bool vec,
                                                u32 lane) {
    u32 tile = l.block > 128 ? l.block : 128;
    for (u32 i = 0; i < tile; i += 128) {
        u64 e0 = t * tile + i + lane * 4;
        if (e0 >= n) break;
        float x[4];
        lp_sum4(a, l, base, k, off, e0, n, x);
        lp_store_out(out, e0, n, vec, x);
    }
}

__device__ __forceinline__ u64 lp_tile(const Lp& l) { return l.block > 128 ? l.block : 128; }


// ---------------------------------------------------------------- batched paths (B <= 128)

// For blocks of at most 128 elements (the default) a warp takes U tiles per step and issues all
// their loads before any arithmetic: peers' memory answers in microseconds, so bytes in flight
// decide the bandwidth. NR bounds the ranks held in registers. Tile tt is still handled by warp
// (tt - lo) mod W in every phase.
template <int NR>
struct Raw {
    float s[NR];
    u32 w[NR];
};

template <int NR>
__device__ __forceinline__ void raw_load(const Lp& l, const u64* base, u32 k, u64 off, u64 e0,
                                         u64 n, Raw<NR>& q) {
#pragma unroll
    for (u32 r = 0; r < NR; r++)
        if (r < k) lp_load_raw((const u8*)(base[r] + off), e0, n, l.block, q.s[r], q.w[r]);
}

template <int NR>
__device__ __forceinline__ void raw_sum(const Args& a, const Lp& l, u32 k, const Raw<NR>& q,
                                        float* x) {
#pragma unroll
    for (u32 r = 0; r < NR; r++)
        if (r < k) lp_decode_into(q.s[r], q.w[r], l.format, r == 0, x);
    if (a.has_div) {
#pragma unroll
        for (int i = 0; i < 4; i++) x[i] = __fdiv_rn(x[i], a.post_div);
    }
}

template <int U>
__device__ void quant_in_run(const Lp& l, const T* in, bool vec, u64 lo, u64 hi, u64 gw, u64 W,
                             u64 n, u8* enc, u32 lane) {
    for (u64 t = lo + gw; t < hi; t += U * W) {
        float x[U][4];
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 tt = t + u * W;
            if (tt < hi) lp_load_in(in, tt * 128 + lane * 4, n, vec, x[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 tt = t + u * W;
            if (tt < hi) {  // warp-uniform: the shuffles see every lane
                u32 m = seg_max(absbits4(x[u]), l.block / 4);
                float s = lp_scale(m, l.format);
                lp_store_codes(enc, tt * 128 + lane * 4, n, l.block, s, x[u], l.format, true);
            }
        }
    }
}

template <int NR, int U>
__device__ void dequant_run(const Args& a, const Lp& l, const u64* base, u32 k, u64 off, u64 lo,
                            u64 hi, u64 gw, u64 W, u64 n, T* out, bool vec, u32 lane) {
    for (u64 t = lo + gw; t < hi; t += U * W) {
        Raw<NR> q[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 e0 = (t + u * W) * 128 + lane * 4;
            if (t + u * W < hi && e0 < n) raw_load<NR>(l, base, k, off, e0, n, q[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 e0 = (t + u * W) * 128 + lane * 4;
            if (t + u * W < hi && e0 < n) {
                float x[4];
                raw_sum<NR>(a, l, k, q[u], x);
                lp_store_out(out, e0, n, vec, x);
            }
        }
    }
}

// Two-shot owner step: sum the tile over k encodings, quantize into `enc` (which may be one of
// them: every lane's loads of a tile complete before the shuffles that precede its stores).
template <int NR, int U>
__device__ void quant_sum_run(const Args& a, const Lp& l, const u64* base, u32 k, u64 lo, u64 hi,
                              u64 gw, u64 W, u64 n, u8* enc, u32 lane) {
    for (u64 t = lo + gw; t < hi; t += U * W) {
        Raw<NR> q[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 e0 = (t + u * W) * 128 + lane * 4;
            if (t + u * W < hi && e0 < n) raw_load<NR>(l, base, k, 0, e0, n, q[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 tt = t + u * W;
            u64 e0 = tt * 128 + lane * 4;
            if (tt < hi) {
                float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (e0 < n) raw_sum<NR>(a, l, k, q[u], x);
                u32 m = seg_max(absbits4(x), l.block / 4);
                float s = lp_scale(m, l.format);
                lp_store_codes(enc, e0, n, l.block, s, x, l.format, true);
            }
        }
    }
}

// Dispatch on the world size (registers per rank) for the batched paths.
#define LP_BY_WORLD(world, CALL2, CALL4, CALLN) \
    if ((world) <= 2) { CALL2; } else if ((world) <= 4) { CALL4; } else { CALLN; }

// Quantize tiles lo..hi of the input into `enc`; dequantize-sum tiles lo..hi of k encodings.
__device__ __forceinline__ void quant_in_tiles(const Args& a, const Lp& l, const T* in, bool vec,
                                               u64 lo, u64 hi, u64 gw, u64 W, u64 n, u8* enc,
                                               u32 lane) {
    if (l.block <= 128) {
        quant_in_run<4>(l, in, vec, lo, hi, gw, W, n, enc, lane);
    } else {
        SrcIn src{in, vec};
        for (u64 t = lo + gw; t < hi; t += W) lp_quant_tile(a, l, src, t, n, enc, lane);
    }
}

__device__ __forceinline__ void dequant_tiles(const Args& a, const Lp& l, const u64* base, u32 k,
                                              u64 off, u64 lo, u64 hi, u64 gw, u64 W, u64 n,
                                              T* out, bool vec, u32 lane) {
    if (l.block <= 128) {
        if (k == 1) {
            dequant_run<1, 4>(a, l, base, k, off, lo, hi, gw, W, n, out, vec, lane);
        } else {
            LP_BY_WORLD(k, (dequant_run<2, 4>(a, l, base, k, off, lo, hi, gw, W, n, out, vec, lane)),
                        (dequant_run<4, 2>(a, l, base, k, off, lo, hi, gw, W, n, out, vec, lane)),
                        (dequant_run<FC_MAX_RANKS, 1>(a, l, base, k, off, lo, hi, gw, W, n, out, vec, lane)))
        }
    } else {
        for (u64 t = lo + gw; t < hi; t += W)
            lp_dequant_tile(a, l, base, k, off, t, n, out, vec, lane);
    }
}

// ---------------------------------------------------------------- one-shot movers

// Records in the staging are read by the peers over NVLink, and 4-byte loads at the 4-byte
// record alignment move a fraction of what 16-byte ones do. So the one-shot kernel works on
// groups of four tiles (512 elements): their records are 16-byte aligned for every B <= 128
// (512 + 2048/B bytes, a multiple of 16); a warp assembles a group in shared memory and stores
// it with 16-byte stores, and receivers fetch it with 16-byte loads. Group g is handled by warp
// g mod W on every rank, in the encode and in the decode, so the per-CTA barrier covers exactly
// the groups a CTA reads.
#define LP_GROUP_ELEMS 512
#define LP_GROUP_BYTES_MAX 640  // 512 elements at B = 16: 32 records of 20 bytes

// Bytes of the records of `m` elements (whole blocks plus a partial one), as Codec::encoded_bytes.
__device__ __forceinline__ u32 lp_rec_bytes(u32 m, u32 B) {
    u32 rest = m & (B - 1);
    return (m >> lp_log2(B)) * (4 + B) + (rest ? 4 + rest : 0);
}

// One group per step, and the next group's loads issued before this one's arithmetic; the next
// group is held raw (16-byte pieces, widened to f32 when used). Measured on 2xH200
// (run 2026-11-30-h200x2-lp-prefetch, commit 184d696) against two groups loaded, then processed:
// quantization alone bf16 64 MB 72.0 -> 59.5 us (timed on a buffer random only in its first 1M
// elements; docs/quant-accuracy.md has the caveat); with two groups per step the encode kernel
// needs 100 registers, one CTA per SM, and lost (99.2 us at 64 MB). Registers decide how many
// warps an SM holds. Nsight Compute on the encode kernel (run 2026-11-30-h200x2-lp-fastq,
// commit a1deb4e) then showed it bound by instructions, not loads: 70% of issue slots busy, ~40
// instructions per element, DRAM at 25%; hence lp_quot, shifts for B and the paired FP8 decode.
#define LP_STEP_GROUPS 1

// Issues the whole-piece loads of the step at g0 (partial or unaligned runs are read when used).
__device__ __forceinline__ void lp_fetch_step(const T* in, bool vec, u64 g0, u64 ghi, u64 W,
                                              u64 n, u32 lane,
                                              uint4 (&r)[LP_STEP_GROUPS][2][LP_PIECES]) {
#pragma unroll
    for (int k = 0; k < LP_STEP_GROUPS; k++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            u64 e0 = (g0 + k * W) * LP_GROUP_ELEMS + h * 256 + lane * 8;
            if (g0 + k * W < ghi && lp_whole(vec, e0, n)) lp_load_pieces(in, e0, r[k][h]);
        }
}

// Where a quantizer stores its records: one buffer (the codec alone), or the same records into
// ranks lo..hi-1, each at byte `off` of its staging (the one-shot family's push); `group(g)` is
// where group g goes. With `split` the odd groups go to the sender's own staging only, at the
// same place, and the receivers pull them after the barrier.
struct EncOne {
    u8* p;
    __device__ __forceinline__ EncOne group(u64) const { return *this; }
    __device__ __forceinline__ u32 count() const { return 1; }
    __device__ __forceinline__ u8* at(u32) const { return p; }
};
struct EncRanks {
    const Args* a;
    u64 off;
    u32 lo, hi;
    u32 split;
    __device__ __forceinline__ EncRanks group(u64 g) const {
        return split && (g & 1) ? EncRanks{a, off, a->rank, a->rank + 1, 0} : *this;
    }
    __device__ __forceinline__ u32 count() const { return hi - lo; }
    __device__ __forceinline__ u8* at(u32 d) const { return (u8*)(a->staging[lo + d] + off); }
};

// Decodes the group at element `first` from the records of k <= NR ranks in the warp's shared
// memory (rank r's at sm + r * LP_GROUP_BYTES_MAX), sums them in rank order (rule 5) and stores
// the group's elements of `out` (divided by post_div when has_div).
template <int NR>
__device__ __forceinline__ void lp_decode_group_sm(const Lp& l, const u8* sm, u32 k, u64 first,
                                                   u64 n, T* out, bool vec, u32 lane, u32 has_div,
                                                   float post_div) {
    u32 B = l.block;
    u32 rec = 4 + B;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        u32 el = h * 256 + lane * 8;
        u64 e0 = first + el;
        if (e0 < n) {
            float x[8];
#pragma unroll
            for (u32 r = 0; r < NR; r++) {
                if (r >= k) break;
                const u8* rp = sm + r * LP_GROUP_BYTES_MAX + (el >> lp_log2(B)) * rec;
                u32 j = el & (B - 1);
                float sc = *(const float*)rp;
                u32 w0, w1;
                if (e0 + 8 <= n) {
                    w0 = *(const u32*)(rp + 4 + j);
                    w1 = *(const u32*)(rp + 8 + j);
                } else {
                    w0 = 0;
                    w1 = 0;
                    for (u32 i = 0; i < 4; i++) {
                        if (e0 + i < n) w0 |= (u32)rp[4 + j + i] << (8 * i);
                        if (e0 + 4 + i < n) w1 |= (u32)rp[8 + j + i] << (8 * i);
                    }
                }
                lp_decode_into(sc, w0, l.format, r == 0, x);
                lp_decode_into(sc, w1, l.format, r == 0, x + 4);
            }
            if (has_div) {
#pragma unroll
                for (int i = 0; i < 8; i++) x[i] = __fdiv_rn(x[i], post_div);
            }
            lp_store_out8(out, e0, n, vec, x);
        }
    }
}

// Quantizes groups glo..ghi (this warp's: glo+gw, +W, ...) of `in` into `enc`. With OWN and `own`
// set (the all-gather) the warp also decodes each group's records from its shared memory into
// `own`, the rank's own output part: the values every peer decodes from the same records,
// written before the barrier instead of read back from the staging after it.
template <class Enc, bool OWN, u32 FMT>
__device__ void quant_groups_f(const Lp& l, const T* in, bool vec, u64 glo, u64 ghi, u64 gw,
                               u64 W, u64 n, const Enc& enc, u32 lane, u8* sm, T* own,
                               bool vown) {
    u32 B = l.block;
    u32 rec = 4 + B;
    u64 sm_shared;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(sm_shared) : "l"(sm));
    u32 sm_base = (u32)sm_shared;
    // A group is two rows of 256 elements; a lane takes eight consecutive elements of a row
    // (one 16-byte load for 2-byte inputs), so a block of B spans B/8 lanes (B >= 16).
    uint4 next[LP_STEP_GROUPS][2][LP_PIECES];
    lp_fetch_step(in, vec, glo + gw, ghi, W, n, lane, next);
    for (u64 g0 = glo + gw; g0 < ghi; g0 += LP_STEP_GROUPS * W) {
        float x[LP_STEP_GROUPS][2][8];
#pragma unroll
        for (int k = 0; k < LP_STEP_GROUPS; k++) {
            u64 first = (g0 + k * W) * LP_GROUP_ELEMS;
            if (g0 + k * W < ghi) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    u64 e0 = first + h * 256 + lane * 8;
                    if (lp_whole(vec, e0, n)) lp_widen8(next[k][h], x[k][h]);
                    else lp_load_in8(in, e0, n, vec, x[k][h]);
                }
            }
        }
        lp_fetch_step(in, vec, g0 + LP_STEP_GROUPS * W, ghi, W, n, lane, next);
#pragma unroll
        for (int k = 0; k < LP_STEP_GROUPS; k++) {
            u64 g = g0 + k * W;
            if (g >= ghi) break;  // warp-uniform
            u64 first = g * LP_GROUP_ELEMS;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                u32 el = h * 256 + lane * 8;  // element inside the group
                // Warp-uniform up to here: every lane takes part in the shuffles.
                u32 m = seg_max(max(absbits4(x[k][h]), absbits4(x[k][h] + 4)), B / 8);
                float s = lp_scale(m, FMT == LP_ANY ? l.format : FMT);
                float y = lp_recip(s);
                if (first + el < n) {
                    u32 off = (el >> lp_log2(B)) * rec;
                    u32 j = el & (B - 1);
                    u32 w[2];
                    lp_encode8<FMT>(x[k][h], s, y, l.format, w);
                    // Shared-window stores at an address taken once (through the generic
                    // pointer the compiler rebuilt the window base for every store).
                    u32 at = sm_base + off;
                    if (j == 0) asm volatile("st.shared.f32 [%0], %1;" ::"r"(at), "f"(s) : "memory");
                    // (4-byte aligned only: a record is 4 + B bytes.)
                    asm volatile("st.shared.u32 [%0], %1;" ::"r"(at + 4 + j), "r"(w[0]) : "memory");
                    asm volatile("st.shared.u32 [%0], %1;" ::"r"(at + 8 + j), "r"(w[1]) : "memory");
                }
            }
            __syncwarp();
            u64 left = n - first;
            u32 gbytes = lp_rec_bytes(left < LP_GROUP_ELEMS ? (u32)left : LP_GROUP_ELEMS, B);
            u64 goff = g * ((LP_GROUP_ELEMS >> lp_log2(B)) * rec);  // 16-aligned (see above)
            // Whole 16-byte pieces, then the last group's tail byte by byte (fc_lp_encode
            // writes a caller's buffer of exactly the encoded size).
            auto dst = enc.group(g);
            for (u32 v = lane; v < gbytes / 16; v += 32) {
                uint4 x = ((const uint4*)sm)[v];
                for (u32 d = 0; d < dst.count(); d++) *(uint4*)(dst.at(d) + goff + v * 16) = x;
            }
            for (u32 i = (gbytes & ~15u) + lane; i < gbytes; i += 32)
                for (u32 d = 0; d < dst.count(); d++) dst.at(d)[goff + i] = sm[i];
            if (OWN && own) lp_decode_group_sm<1>(l, sm, 1, first, n, own, vown, lane, 0, 1.0f);
            __syncwarp();
        }
    }
}

// quant_groups_f for the default format (E4M3) built with it known, the others reading it.
template <class Enc, bool OWN = false>
__device__ __forceinline__ void quant_groups(const Lp& l, const T* in, bool vec, u64 glo,
                                             u64 ghi, u64 gw, u64 W, u64 n, const Enc& enc,
                                             u32 lane, u8* sm, T* own = nullptr,
                                             bool vown = false) {
    if (l.format == LP_E4M3)
        quant_groups_f<Enc, OWN, LP_E4M3>(l, in, vec, glo, ghi, gw, W, n, enc, lane, sm, own, vown);
    else
        quant_groups_f<Enc, OWN, LP_ANY>(l, in, vec, glo, ghi, gw, W, n, enc, lane, sm, own, vown);
}

// The decode for more than four ranks (more than shared memory holds): 4-byte loads straight
// from the ranks' staging. Decodes groups glo..ghi of k encodings: this warp's groups are
// glo+gw, +W, ...; their tiles (four per group) are taken U at a time, all loads of a batch
// before the arithmetic.
template <int NR, int U>
__device__ void dequant_groups(const Args& a, const Lp& l, const u64* base, u32 k, u64 glo,
                               u64 ghi, u64 gw, u64 W, u64 n, T* out, bool vec, u32 lane) {
    u64 ng = ghi > glo + gw ? (ghi - glo - gw + W - 1) / W : 0;
    for (u64 i = 0; i < ng * 4; i += U) {
        Raw<NR> q[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 j = i + u;
            u64 e0 = ((glo + gw + (j / 4) * W) * 4 + j % 4) * 128 + lane * 4;
            if (j < ng * 4 && e0 < n) raw_load<NR>(l, base, k, 0, e0, n, q[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 j = i + u;
            u64 e0 = ((glo + gw + (j / 4) * W) * 4 + j % 4) * 128 + lane * 4;
            if (j < ng * 4 && e0 < n) {
                float x[4];
                raw_sum<NR>(a, l, k, q[u], x);
                lp_store_out(out, e0, n, vec, x);
            }
        }
    }
}

// The decode: the group's records of each of k <= NR ranks (16-byte aligned, see above)
// are fetched with 16-byte loads, all ranks' loads in flight at once, into the warp's shared
// memory (NR * LP_GROUP_BYTES_MAX bytes), then decoded and summed in rank order from there.
// With `odd` set, odd groups come from odd[0..k) instead (a split push: see EncRanks).
template <int NR>
__device__ void dequant_groups_pull(const Args& a, const Lp& l, const u64* base, u32 k, u64 glo,
                                    u64 ghi, u64 gw, u64 W, u64 n, T* out, bool vec, u32 lane,
                                    u8* sm, const u64* odd = nullptr) {
    u32 B = l.block;
    u32 rec = 4 + B;
    for (u64 g = glo + gw; g < ghi; g += W) {
        const u64* src = odd && (g & 1) ? odd : base;
        u64 first = g * LP_GROUP_ELEMS;
        u64 left = n - first;
        u32 gbytes = lp_rec_bytes(left < LP_GROUP_ELEMS ? (u32)left : LP_GROUP_ELEMS, B);
        u32 nv = (gbytes + 15) / 16;  // <= 40: two pieces per lane at most
        u64 goff = g * ((LP_GROUP_ELEMS >> lp_log2(B)) * rec);
        uint4 v[NR][2];
#pragma unroll
        for (u32 r = 0; r < NR; r++)
#pragma unroll
            for (u32 h = 0; h < 2; h++)
                if (r < k && lane + 32 * h < nv)
                    v[r][h] = ld_v4((const uint4*)(src[r] + goff + (lane + 32 * h) * 16));
#pragma unroll
        for (u32 r = 0; r < NR; r++)
#pragma unroll
            for (u32 h = 0; h < 2; h++)
                if (r < k && lane + 32 * h < nv)
                    ((uint4*)(sm + r * LP_GROUP_BYTES_MAX))[lane + 32 * h] = v[r][h];
        __syncwarp();
        lp_decode_group_sm<NR>(l, sm, k, first, n, out, vec, lane, a.has_div, a.post_div);
        __syncwarp();
    }
}

// Decodes units 0..nu (groups for B <= 128, tiles above) of k encodings at base[0..k) (odd
// groups at odd[0..k) where given: a split push, groups only, k <= 4).
__device__ __forceinline__ void lp_decode_units(const Args& a, const Lp& l, const u64* base,
                                                u32 k, u64 nu, u64 gw, u64 W, u64 n, T* out,
                                                bool vec, u32 lane, u8* sm,
                                                const u64* odd = nullptr) {
    if (l.block > 128) dequant_tiles(a, l, base, k, 0, 0, nu, gw, W, n, out, vec, lane);
    else if (k == 1) dequant_groups_pull<1>(a, l, base, k, 0, nu, gw, W, n, out, vec, lane, sm, odd);
    else if (k == 2) dequant_groups_pull<2>(a, l, base, k, 0, nu, gw, W, n, out, vec, lane, sm, odd);
    else if (k <= 4) dequant_groups_pull<4>(a, l, base, k, 0, nu, gw, W, n, out, vec, lane, sm, odd);
    else dequant_groups<FC_MAX_RANKS, 1>(a, l, base, k, 0, nu, gw, W, n, out, vec, lane);
}

// ---------------------------------------------------------------- codec alone

// Encodes a.count elements of a.input into a.output (the wire layout); no communication. Blocks
// up to 128 go through the collectives' quantizer (groups in shared memory).
#ifdef FC_GROUP_LOWP
extern "C" __global__ void __launch_bounds__(512) fc_lp_encode(Args a, Lp l) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    __shared__ __align__(16) u8 smem[LP_WARPS][LP_GROUP_BYTES_MAX];
    u32 lane = threadIdx.x & 31;
    u64 W = (u64)gridDim.x * LP_WARPS;
    u64 gw = (u64)blockIdx.x * LP_WARPS + (threadIdx.x >> 5);
    bool vin = (a.input & 15) == 0;
    if (l.block <= 128 && (a.output & 15) == 0) {
        u64 ng = (a.count + LP_GROUP_ELEMS - 1) / LP_GROUP_ELEMS;
        quant_groups(l, (const T*)a.input, vin, 0, ng, gw, W, a.count, EncOne{(u8*)a.output},
                     lane, smem[threadIdx.x >> 5]);
    } else {
        u64 nt = (a.count + lp_tile(l) - 1) / lp_tile(l);
        quant_in_tiles(a, l, (const T*)a.input, vin, 0, nt, gw, W, a.count, (u8*)a.output, lane);
    }
}
#endif

// One kernel for the one-shot family, on one chunk of a.count elements per part. Every rank
// quantizes each of its `nin` input parts once, then after the per-CTA barrier decodes what is
// meant for it: the records of all ranks summed in rank order into output part 0 (all_reduce
// one-shot, reduce_scatter) or rank r's into output part r (all_gather, all_to_all). Where the
// records go:
// - push (l.push = 1): straight into the staging of the rank(s) that decode them, over NVLink,
//   at slot `rank` there (one input part to every rank: all_reduce, all_gather; part p to rank
//   p: reduce_scatter, all_to_all); the link carries stores while the quantizer reads its input,
//   and every rank decodes from its own memory. Needs a region per sender.
// - pull (l.push = 0): into region p of the sender's own staging; receivers read region 0 (one
//   part) or region `rank` (a part per rank) of every rank over NVLink.
// Every rank decodes its own records too, so results are identical across ranks (rule 5); in
// the all-gather the quantizer decodes them from its shared memory straight into the own output
// part, before the barrier. Measured on 2xH200 (run 2026-11-30-h200x2-lp-own, commit 8a589b0): 16 MB
// 29.55 -> 26.66 us, 4 MB 13.69 -> 12.73; in the WIDE build the same code cost 5% at 64 MB (its
// registers are capped), so that build reads the own part back after the barrier. In the
// all-to-all the own part reaches no other rank: it is not encoded but copied as it is (in place
// it stays put). Overlapping quantization, link and decode in rounds was measured in two forms,
// every warp in turn and warps by role, and lost in both (docs/quant-accuracy.md,
// run 2026-11-30-h200x2-lp-rounds, commit a3e876b).
template <bool WIDE>
__device__ __forceinline__ void lp_move(const Args& a, const Lp& l) {
    __shared__ __align__(16) u8 smem[LP_WARPS][4 * LP_GROUP_BYTES_MAX];
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    u64 par = (u64)(e & 1) * a.staging_bytes;
    u32 lane = threadIdx.x & 31;
    u8* sm = smem[threadIdx.x >> 5];
    u64 W = (u64)gridDim.x * LP_WARPS;
    u64 gw = (u64)blockIdx.x * LP_WARPS + (threadIdx.x >> 5);
    u64 n = a.count;
    bool grouped = l.block <= 128;
    u64 nu = grouped ? (n + LP_GROUP_ELEMS - 1) / LP_GROUP_ELEMS : (n + lp_tile(l) - 1) / lp_tile(l);
    bool vin = (a.input & 15) == 0 && (l.in_stride * sizeof(T)) % 16 == 0;
    bool vout = (a.output & 15) == 0 && (l.out_stride * sizeof(T)) % 16 == 0;
    bool a2a = l.nin > 1 && !l.reduce;
    // All-to-all-v (per-part counts) runs in the plain kernel only, at every size (the host
    // never launches the wide one for it): the wide kernel's registers are capped, and without
    // this the per-part bookkeeping added to its spills.
    bool v = !WIDE && l.v;
    // All-gather: the own part decoded by the quantizer (in place it reads each group of the
    // input before the same warp overwrites it).
    T* own = !WIDE && l.nin == 1 && !l.reduce && grouped ? (T*)a.output + a.rank * l.out_stride
                                                          : nullptr;
    u64 slot = par + (u64)a.rank * l.region;  // this rank's slot in every receiver's staging
    // A split push needs the sender's own slot free for what it keeps back: one part (the same
    // records for every receiver, its own decode included) or the all-to-all at two ranks (the
    // own part is not encoded).
    u32 split = l.split && l.push && (l.nin == 1 || (a2a && a.world == 2)) && a.world <= 4 ? 1 : 0;
    for (u32 p = 0; p < l.nin; p++) {
        if (a2a && p == a.rank) continue;
        const T* in = (const T*)a.input + (v ? lp_v(l.sdispl, p) : p * l.in_stride);
        // All-to-all-v: this part's own count, units and alignment (the grid, and so which warp
        // takes a group, is the same on every rank: it comes from the largest crossing part).
        u64 np = v ? lp_v(l.scount, p) : n;
        u64 nup = v ? (np + LP_GROUP_ELEMS - 1) / LP_GROUP_ELEMS : nu;
        bool vinp = v ? ((u64)in & 15) == 0 : vin;
        EncRanks to = l.push ? EncRanks{&a, slot, l.nin == 1 ? 0 : p, l.nin == 1 ? a.world : p + 1,
                                        split}
                             : EncRanks{&a, par + (u64)p * l.region, a.rank, a.rank + 1, 0};
        if (grouped) {
            // The wide build, capped at 64 registers, holds one quantizer, as before (a second,
            // for E4M3, added to its spills).
            if (WIDE)
                quant_groups_f<EncRanks, false, LP_ANY>(l, in, vinp, 0, nup, gw, W, np, to, lane, sm,
                                                        own, vout);
            else
                quant_groups<EncRanks, true>(l, in, vinp, 0, nup, gw, W, np, to, lane, sm, own, vout);
        } else {
            // Once per receiver; the host pushes only grouped blocks (cuda/lowp.rs, plan), and
            // sends all-to-all-v only in groups.
            for (u32 d = 0; d < to.count(); d++)
                quant_in_tiles(a, l, in, vinp, 0, nup, gw, W, np, to.at(d), lane);
        }
    }
    // The all-to-all's own part, copied while the pushed records cross the link (the push phase
    // is bound by the link, so the copy's HBM traffic fits beside it). Not in place: distinct
    // buffers, any thread may copy any piece (no barrier covers it).
    if (a2a)
        copy_local((u8*)((T*)a.output + (v ? lp_v(l.rdispl, a.rank) : a.rank * l.out_stride)),
                   (const u8*)((const T*)a.input + (v ? lp_v(l.sdispl, a.rank) : a.rank * l.in_stride)),
                   (v ? lp_v(l.rcount, a.rank) : n) * sizeof(T));
    if (lp_meet(a, l, e, t0, 0)) {
        u64 base[FC_MAX_RANKS];
#pragma unroll
        for (u32 r = 0; r < FC_MAX_RANKS; r++)
            base[r] = r >= a.world ? 0
                      : l.push     ? a.staging[a.rank] + par + (u64)r * l.region
                                   : a.staging[r] + par + (u64)(l.nin == 1 ? 0 : a.rank) * l.region;
        // A split push: the odd groups are in each sender's own staging, at its slot there.
        u64 odd_base[4];
#pragma unroll
        for (u32 r = 0; r < 4; r++)
            odd_base[r] = r < a.world ? a.staging[r] + par + (u64)r * l.region : 0;
        const u64* odd = split ? odd_base : nullptr;
        if (l.reduce) {
            lp_decode_units(a, l, base, a.world, nu, gw, W, n, (T*)a.output, vout, lane, sm, odd);
        } else {
            for (u32 r = 0; r < a.world; r++) {
                if ((a2a || own) && r == a.rank) continue;
                T* out = (T*)a.output + (v ? lp_v(l.rdispl, r) : r * l.out_stride);
                u64 nr = v ? lp_v(l.rcount, r) : n;
                u64 nur = v ? (nr + LP_GROUP_ELEMS - 1) / LP_GROUP_ELEMS : nu;
                bool voutr = v ? ((u64)out & 15) == 0 : vout;
                lp_decode_units(a, l, base + r, 1, nur, gw, W, nr, out, voutr, lane, sm,
                                odd ? odd + r : nullptr);
            }
        }
    }
    end_call(a, e);
}

// Two builds of one body: 106 registers leave room for one CTA of 16 warps per SM; capped at 64
// (some spilled to the L1-cached stack) two fit, twice the loads in flight. Measured on 2xH200
// (run 2026-11-30-h200x2-lp-occupancy, commit 2a43a1c): the wide build is 9-14% faster from 32 MiB
// parts up (bf16 all-reduce 64 MB 218.8 -> 196.9 us, all-gather 128.4 -> 118.5, all-to-all
// 172.9 -> 150.5) and up to 27% slower below (f32 all-reduce 16 MB 31.9 -> 40.5 us), so the
// host picks it by chunk size (LP_WIDE_MIN_BYTES in cuda/lowp.rs). A build for two ranks only
// (no code for more: 64 registers without spilling, two CTAs per SM) was no faster than either
// (run 2026-11-30-h200x2-lp-push, commit 02aaca0).
#ifdef FC_GROUP_LOWP
extern "C" __global__ void __launch_bounds__(512) fc_lp_move(Args a, Lp l) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    lp_move<false>(a, l);
}
#endif

#ifdef FC_GROUP_LOWP
extern "C" __global__ void __launch_bounds__(512, 2) fc_lp_move_wide(Args a, Lp l) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    lp_move<true>(a, l);
}
#endif

// ---------------------------------------------------------------- two-shot all-reduce

// Every rank encodes its whole chunk into its staging; the owner of stripe k (tiles
// k*nt/world ..) sums that stripe of every rank in f32 in rank order, quantizes the sum once
// back into its own staging (only it touches its stripe there between the barriers), and after
// the second barrier every rank, the owner too, decodes every stripe from its owner's staging:
// all ranks consume the same quantized values (rule 5).
#ifdef FC_GROUP_LOWP
extern "C" __global__ void __launch_bounds__(512) fc_lp_tree(Args a, Lp l) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    u64 par = (u64)(e & 1) * a.staging_bytes;
    u32 lane = threadIdx.x & 31;
    u64 W = (u64)gridDim.x * LP_WARPS;
    u64 gw = (u64)blockIdx.x * LP_WARPS + (threadIdx.x >> 5);
    u64 n = a.count;
    u64 nt = (n + lp_tile(l) - 1) / lp_tile(l);
    bool vin = (a.input & 15) == 0;
    bool vout = (a.output & 15) == 0;
    u8* mine = (u8*)(a.staging[a.rank] + par);
    u64 base[FC_MAX_RANKS];
#pragma unroll
    for (u32 r = 0; r < FC_MAX_RANKS; r++) base[r] = r < a.world ? a.staging[r] + par : 0;
    for (u32 k = 0; k < a.world; k++)
        quant_in_tiles(a, l, (const T*)a.input, vin, k * nt / a.world, (k + 1) * nt / a.world,
                       gw, W, n, mine, lane);
    bool ok = lp_meet(a, l, e, t0, 0);
    if (ok) {
        u64 lo = a.rank * nt / a.world, hi = (a.rank + 1) * nt / a.world;
        // Each warp reads all ranks' codes of its tile before writing its own record (the
        // loads complete into registers first), so the in-place rewrite is safe.
        if (l.block <= 128) {
            LP_BY_WORLD(a.world, (quant_sum_run<2, 4>(a, l, base, a.world, lo, hi, gw, W, n, mine, lane)),
                        (quant_sum_run<4, 2>(a, l, base, a.world, lo, hi, gw, W, n, mine, lane)),
                        (quant_sum_run<FC_MAX_RANKS, 1>(a, l, base, a.world, lo, hi, gw, W, n, mine, lane)))
        } else {
            SrcSum sum{base, a.world, 0};
            for (u64 t = lo + gw; t < hi; t += W) lp_quant_tile(a, l, sum, t, n, mine, lane);
        }
        ok = lp_meet(a, l, e, t0, 1);
    }
    if (ok) {
        Args nodiv = a;
        nodiv.has_div = 0;  // the owner divided before quantizing
        for (u32 i = 0; i < a.world; i++) {
            u32 k = (a.rank + i) % a.world;
            dequant_tiles(nodiv, l, base + k, 1, 0, k * nt / a.world, (k + 1) * nt / a.world, gw,
                          W, n, (T*)a.output, vout, lane);
        }
    }
    end_call(a, e);
}
#endif
