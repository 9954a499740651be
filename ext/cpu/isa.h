// Runtime instruction-set dispatch for the CPU kernels.
//
// Each kernel body is written once as an always-inline function and compiled
// several times inside wrappers carrying __attribute__((target(...))); the
// variant is picked at run time with cpuid (__builtin_cpu_supports, which also
// checks that the OS saves the wide registers). Every variant does the same
// IEEE float32 operations in the same order (no FMA: -ffp-contract=off), so
// results are bit-identical whichever one runs. QTRAIN_EXT_ISA or
// qtrain._ext.set_isa() force a variant, which is how the tests check that.
#pragma once

#include <string>
#include <vector>

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define QT_X86_DISPATCH 1
#define QT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define QT_TARGET_AVX2 __attribute__((target("avx2")))
// AVX-512 plus VNNI (vpdpbusd): the int8 GEMM's fastest kernel.
#define QT_TARGET_AVX512VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#else
#define QT_X86_DISPATCH 0
#endif

// A kernel file defines one table per variant, PREFIX##default, PREFIX##avx2 and
// PREFIX##avx512 (the x86 ones only where QT_X86_DISPATCH); this picks the one to run.
#if QT_X86_DISPATCH
#define QT_SELECT_VARIANT(PREFIX) \
  (::qtrain::isa::select(PREFIX##default, PREFIX##avx2, PREFIX##avx512))
#else
#define QT_SELECT_VARIANT(PREFIX) (PREFIX##default)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define QT_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define QT_ALWAYS_INLINE inline
#endif

namespace qtrain {
namespace isa {

// kAvx512Vnni is AVX-512 (as kAvx512) plus VNNI; only kernels that profit from
// VNNI (the int8 GEMM) tell the two apart, through variant().
enum Isa : int { kDefault = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3 };

// "avx512vnni" / "avx512f" / "avx2" / "default"
const char* name(int isa);
// Variants compiled into this build, best first.
std::vector<std::string> compiled();
// Variants this CPU can run, best first.
std::vector<std::string> supported();
// Best variant this CPU can run.
int best();
// Vector family in use: kAvx512 also when the avx512vnni variant is selected, so
// kernels without a VNNI-specific path keep switching on kAvx512 / kAvx2 / kDefault.
int current();
// Exact variant in use (QTRAIN_EXT_ISA at first use, else best()), kAvx512Vnni included.
int variant();
// Force a variant by name; throws c10::ValueError if unknown or unsupported. Returns the previous.
std::string set(const std::string& name);

// The table of kernels for the vector family in use (see QT_SELECT_VARIANT).
template <typename T>
const T& select(const T& portable, const T& avx2, const T& avx512) {
  switch (current()) {
    case kAvx512:
      return avx512;
    case kAvx2:
      return avx2;
    default:
      return portable;
  }
}

}  // namespace isa
}  // namespace qtrain
