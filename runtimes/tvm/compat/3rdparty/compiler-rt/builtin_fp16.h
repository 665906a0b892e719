/*
 * edgepack compat header (not part of the apache-tvm wheel).
 *
 * Generic IEEE-754 narrowing/widening conversions, the algorithm of LLVM
 * compiler-rt's fp_trunc_impl.inc / fp_extend_impl.inc (Apache-2.0 WITH
 * LLVM-exception), written as the two templates that builtin_fp16.cc uses to
 * define __gnu_f2h_ieee, __gnu_h2f_ieee and __truncdfhf2:
 *   __truncXfYf2__<SRC_T, SRC_REP_T, SRC_SIG_BITS, DST_T, DST_REP_T, DST_SIG_BITS>(a)
 *   __extendXfYf2__<SRC_T, SRC_REP_T, SRC_SIG_BITS, DST_T, DST_REP_T, DST_SIG_BITS>(a)
 * Rounding is to nearest, ties to even; NaN payloads are kept where they fit.
 */
#ifndef EDGEPACK_COMPAT_BUILTIN_FP16_H_
#define EDGEPACK_COMPAT_BUILTIN_FP16_H_

#include <climits>
#include <cstdint>
#include <cstring>

namespace edgepack_fp16_detail {

template <typename REP_T, typename T>
static inline REP_T ToRep(T x) {
  static_assert(sizeof(REP_T) == sizeof(T), "representation size mismatch");
  REP_T rep;
  std::memcpy(&rep, &x, sizeof(rep));
  return rep;
}

template <typename T, typename REP_T>
static inline T FromRep(REP_T rep) {
  static_assert(sizeof(REP_T) == sizeof(T), "representation size mismatch");
  T x;
  std::memcpy(&x, &rep, sizeof(x));
  return x;
}

template <typename REP_T>
static inline int CountLeadingZeros(REP_T x) {
  int n = 0;
  for (int bit = static_cast<int>(sizeof(REP_T) * CHAR_BIT) - 1; bit >= 0; --bit) {
    if ((x >> bit) & 1) break;
    ++n;
  }
  return n;
}

}  // namespace edgepack_fp16_detail

template <typename SRC_T, typename SRC_REP_T, int SRC_SIG_BITS, typename DST_T, typename DST_REP_T,
          int DST_SIG_BITS>
static inline DST_T __truncXfYf2__(SRC_T a) {
  using src_rep_t = SRC_REP_T;
  using dst_rep_t = DST_REP_T;
  const int srcSigBits = SRC_SIG_BITS;
  const int dstSigBits = DST_SIG_BITS;

  const int srcBits = sizeof(SRC_T) * CHAR_BIT;
  const int srcExpBits = srcBits - srcSigBits - 1;
  const int srcInfExp = (1 << srcExpBits) - 1;
  const int srcExpBias = srcInfExp >> 1;

  const src_rep_t srcMinNormal = src_rep_t(1) << srcSigBits;
  const src_rep_t srcSignificandMask = srcMinNormal - 1;
  const src_rep_t srcInfinity = static_cast<src_rep_t>(srcInfExp) << srcSigBits;
  const src_rep_t srcSignMask = src_rep_t(1) << (srcSigBits + srcExpBits);
  const src_rep_t srcAbsMask = srcSignMask - 1;
  const src_rep_t roundMask = (src_rep_t(1) << (srcSigBits - dstSigBits)) - 1;
  const src_rep_t halfway = src_rep_t(1) << (srcSigBits - dstSigBits - 1);
  const src_rep_t srcQNaN = src_rep_t(1) << (srcSigBits - 1);
  const src_rep_t srcNaNCode = srcQNaN - 1;

  const int dstBits = sizeof(DST_T) * CHAR_BIT;
  const int dstExpBits = dstBits - dstSigBits - 1;
  const int dstInfExp = (1 << dstExpBits) - 1;
  const int dstExpBias = dstInfExp >> 1;

  const int underflowExponent = srcExpBias + 1 - dstExpBias;
  const int overflowExponent = srcExpBias + dstInfExp - dstExpBias;
  const src_rep_t underflow = static_cast<src_rep_t>(underflowExponent) << srcSigBits;
  const src_rep_t overflow = static_cast<src_rep_t>(overflowExponent) << srcSigBits;

  const dst_rep_t dstQNaN = dst_rep_t(1) << (dstSigBits - 1);
  const dst_rep_t dstNaNCode = dstQNaN - 1;

  const src_rep_t aRep = edgepack_fp16_detail::ToRep<src_rep_t>(a);
  const src_rep_t aAbs = aRep & srcAbsMask;
  const src_rep_t sign = aRep & srcSignMask;
  dst_rep_t absResult;

  if (static_cast<src_rep_t>(aAbs - underflow) < static_cast<src_rep_t>(aAbs - overflow)) {
    // normal in the destination: shift with rounding, rebias the exponent
    absResult = static_cast<dst_rep_t>(aAbs >> (srcSigBits - dstSigBits));
    absResult = static_cast<dst_rep_t>(
        absResult - (static_cast<dst_rep_t>(srcExpBias - dstExpBias) << dstSigBits));
    const src_rep_t roundBits = aAbs & roundMask;
    if (roundBits > halfway) {
      absResult++;
    } else if (roundBits == halfway) {
      absResult = static_cast<dst_rep_t>(absResult + (absResult & 1));
    }
  } else if (aAbs > srcInfinity) {
    // NaN: quiet it and keep the top of the payload
    absResult = static_cast<dst_rep_t>(static_cast<dst_rep_t>(dstInfExp) << dstSigBits);
    absResult |= dstQNaN;
    absResult |= static_cast<dst_rep_t>(((aAbs & srcNaNCode) >> (srcSigBits - dstSigBits)) &
                                        dstNaNCode);
  } else if (aAbs >= overflow) {
    absResult = static_cast<dst_rep_t>(static_cast<dst_rep_t>(dstInfExp) << dstSigBits);
  } else {
    // denormal or zero in the destination
    const int aExp = static_cast<int>(aAbs >> srcSigBits);
    const int shift = srcExpBias - dstExpBias - aExp + 1;
    const src_rep_t significand = (aRep & srcSignificandMask) | srcMinNormal;
    if (shift > srcSigBits) {
      absResult = 0;
    } else {
      const bool sticky = static_cast<src_rep_t>(significand << (srcBits - shift)) != 0;
      const src_rep_t denormalized = (significand >> shift) | static_cast<src_rep_t>(sticky);
      absResult = static_cast<dst_rep_t>(denormalized >> (srcSigBits - dstSigBits));
      const src_rep_t roundBits = denormalized & roundMask;
      if (roundBits > halfway) {
        absResult++;
      } else if (roundBits == halfway) {
        absResult = static_cast<dst_rep_t>(absResult + (absResult & 1));
      }
    }
  }
  const dst_rep_t result =
      static_cast<dst_rep_t>(absResult | static_cast<dst_rep_t>(sign >> (srcBits - dstBits)));
  return edgepack_fp16_detail::FromRep<DST_T>(result);
}

template <typename SRC_T, typename SRC_REP_T, int SRC_SIG_BITS, typename DST_T, typename DST_REP_T,
          int DST_SIG_BITS>
static inline DST_T __extendXfYf2__(SRC_T a) {
  using src_rep_t = SRC_REP_T;
  using dst_rep_t = DST_REP_T;
  const int srcSigBits = SRC_SIG_BITS;
  const int dstSigBits = DST_SIG_BITS;

  const int srcBits = sizeof(SRC_T) * CHAR_BIT;
  const int srcExpBits = srcBits - srcSigBits - 1;
  const int srcInfExp = (1 << srcExpBits) - 1;
  const int srcExpBias = srcInfExp >> 1;

  const src_rep_t srcMinNormal = static_cast<src_rep_t>(src_rep_t(1) << srcSigBits);
  const src_rep_t srcInfinity = static_cast<src_rep_t>(static_cast<src_rep_t>(srcInfExp) << srcSigBits);
  const src_rep_t srcSignMask = static_cast<src_rep_t>(src_rep_t(1) << (srcSigBits + srcExpBits));
  const src_rep_t srcAbsMask = static_cast<src_rep_t>(srcSignMask - 1);
  const src_rep_t srcQNaN = static_cast<src_rep_t>(src_rep_t(1) << (srcSigBits - 1));
  const src_rep_t srcNaNCode = static_cast<src_rep_t>(srcQNaN - 1);

  const int dstBits = sizeof(DST_T) * CHAR_BIT;
  const int dstExpBits = dstBits - dstSigBits - 1;
  const int dstInfExp = (1 << dstExpBits) - 1;
  const int dstExpBias = dstInfExp >> 1;
  const dst_rep_t dstMinNormal = dst_rep_t(1) << dstSigBits;

  const src_rep_t aRep = edgepack_fp16_detail::ToRep<src_rep_t>(a);
  const src_rep_t aAbs = static_cast<src_rep_t>(aRep & srcAbsMask);
  const src_rep_t sign = static_cast<src_rep_t>(aRep & srcSignMask);
  dst_rep_t absResult;

  if (static_cast<src_rep_t>(aAbs - srcMinNormal) <
      static_cast<src_rep_t>(srcInfinity - srcMinNormal)) {
    // normal: widen the significand, rebias the exponent
    absResult = static_cast<dst_rep_t>(aAbs) << (dstSigBits - srcSigBits);
    absResult += static_cast<dst_rep_t>(dstExpBias - srcExpBias) << dstSigBits;
  } else if (aAbs >= srcInfinity) {
    // infinity or NaN
    absResult = static_cast<dst_rep_t>(dstInfExp) << dstSigBits;
    absResult |= static_cast<dst_rep_t>(aAbs & srcQNaN) << (dstSigBits - srcSigBits);
    absResult |= static_cast<dst_rep_t>(aAbs & srcNaNCode) << (dstSigBits - srcSigBits);
  } else if (aAbs != 0) {
    // denormal: renormalise
    const int scale = edgepack_fp16_detail::CountLeadingZeros(aAbs) -
                      edgepack_fp16_detail::CountLeadingZeros(srcMinNormal);
    absResult = static_cast<dst_rep_t>(aAbs) << (dstSigBits - srcSigBits + scale);
    absResult ^= dstMinNormal;
    const int resultExponent = dstExpBias - srcExpBias - scale + 1;
    absResult |= static_cast<dst_rep_t>(resultExponent) << dstSigBits;
  } else {
    absResult = 0;
  }
  const dst_rep_t result = absResult | (static_cast<dst_rep_t>(sign) << (dstBits - srcBits));
  return edgepack_fp16_detail::FromRep<DST_T>(result);
}

#endif  // EDGEPACK_COMPAT_BUILTIN_FP16_H_
