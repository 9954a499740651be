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
#else
#define QT_X86_DISPATCH 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define QT_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define QT_ALWAYS_INLINE inline
#endif

namespace qtrain {
namespace isa {

enum Isa : int { kDefault = 0, kAvx2 = 1, kAvx512 = 2 };

// "avx512f" / "avx2" / "default"
const char* name(int isa);
// Variants compiled into this build, best first.
std::vector<std::string> compiled();
// Variants this CPU can run, best first.
std::vector<std::string> supported();
// Best variant this CPU can run.
int best();
// Variant in use (QTRAIN_EXT_ISA at first use, else best()).
int current();
// Force a variant by name; throws c10::ValueError if unknown or unsupported. Returns the previous.
std::string set(const std::string& name);

}  // namespace isa
}  // namespace qtrain
