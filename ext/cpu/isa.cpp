// Runtime ISA selection (see isa.h).
#include "cpu/isa.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>

namespace qtrain {
namespace isa {

namespace {

bool cpu_has(int isa) {
#if QT_X86_DISPATCH
  switch (isa) {
    case kAvx512Vnni:
      return cpu_has(kAvx512) && __builtin_cpu_supports("avx512vnni");
    case kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case kAvx2:
      return __builtin_cpu_supports("avx2");
    default:
      return true;
  }
#else
  return isa == kDefault;
#endif
}

int parse(const std::string& s) {
  if (s == "avx512vnni" || s == "vnni") return kAvx512Vnni;
  if (s == "avx512f" || s == "avx512") return kAvx512;
  if (s == "avx2") return kAvx2;
  if (s == "default" || s == "generic") return kDefault;
  return -1;
}

int initial() {
  int isa = best();
  if (const char* env = std::getenv("QTRAIN_EXT_ISA")) {
    const int forced = parse(env);
    // An unknown or unsupported request keeps the best variant; info() shows which one runs.
    if (forced >= 0 && cpu_has(forced)) isa = forced;
  }
  return isa;
}

std::atomic<int>& state() {
  static std::atomic<int> s{initial()};
  return s;
}

}  // namespace

const char* name(int isa) {
  switch (isa) {
    case kAvx512Vnni:
      return "avx512vnni";
    case kAvx512:
      return "avx512f";
    case kAvx2:
      return "avx2";
    default:
      return "default";
  }
}

std::vector<std::string> compiled() {
#if QT_X86_DISPATCH
  return {"avx512vnni", "avx512f", "avx2", "default"};
#else
  return {"default"};
#endif
}

std::vector<std::string> supported() {
  std::vector<std::string> out;
  for (int isa : {kAvx512Vnni, kAvx512, kAvx2, kDefault}) {
    if (cpu_has(isa)) out.emplace_back(name(isa));
  }
  return out;
}

int best() {
#if QT_X86_DISPATCH
  __builtin_cpu_init();
#endif
  for (int isa : {kAvx512Vnni, kAvx512, kAvx2}) {
    if (cpu_has(isa)) return isa;
  }
  return kDefault;
}

int variant() { return state().load(std::memory_order_relaxed); }

int current() {
  const int v = variant();
  return v == kAvx512Vnni ? kAvx512 : v;
}

std::string set(const std::string& s) {
  const int isa = parse(s);
  TORCH_CHECK_VALUE(isa >= 0, "qtrain._ext.set_isa: unknown ISA '", s,
                    "'; allowed: 'avx512vnni', 'avx512f', 'avx2', 'default'");
  TORCH_CHECK_VALUE(cpu_has(isa), "qtrain._ext.set_isa: this CPU cannot run '", s,
                    "' kernels");
  return name(state().exchange(isa));
}

}  // namespace isa
}  // namespace qtrain
