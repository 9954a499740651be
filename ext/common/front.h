// How an op of the qtrain library is declared: one front file per op (ext/ops/<op>.cpp)
// gives its schema and its argument checks, and each device's kernel file
// (ext/cpu/<op>_kernel.cpp, ext/cuda/<op>_kernel.cu) registers its kernel.
//
// The checks run once per call, before the dispatcher picks a device kernel: they
// are registered at the BackendSelect key, which every call of an op that has a
// kernel there passes through (also under torch.inference_mode, which skips the
// autograd keys), and then the call continues to the CPU, CUDA or Meta kernel. So
// checks look only at what every device has (dtypes, shapes, devices, scalar
// arguments); what only the data can tell (an index out of range, a NaN) is found
// by the kernel that reads it. Fake tensors (torch.compile, opcheck) stop at the
// Python key above BackendSelect and get their shapes from qtrain/ops/fakes.py.
//
// An op is a struct with kName ("quantize_symmetric"), kSchema (its torch schema),
// Signature (the C++ function type of its kernels) and a static check() taking the
// kernel's arguments; a front file then writes
//
//   TORCH_LIBRARY_FRAGMENT(qtrain, m) { qtrain::front::define<QuantizeSymmetric>(m); }
//   TORCH_LIBRARY_IMPL(qtrain, BackendSelect, m) { qtrain::front::check_first<QuantizeSymmetric>(m); }
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

namespace qtrain {
namespace front {

// The keys below BackendSelect: where the device kernels (CPU, CUDA, Meta) are.
inline c10::DispatchKeySet device_keys(c10::DispatchKeySet keys) {
  return keys &
         c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);
}

template <class Op, class Sig = typename Op::Signature>
struct Checked;

// Checked<Op>::call: Op's checks, then Op's kernel for the arguments' device.
template <class Op, class R, class... Args>
struct Checked<Op, R(Args...)> {
  static R call(c10::DispatchKeySet keys, Args... args) {
    Op::check(args...);
    static const auto handle =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow((std::string("qtrain::") + Op::kName).c_str(), "")
            .template typed<R(Args...)>();
    return handle.redispatch(device_keys(keys), args...);
  }
};

template <class Op>
void define(torch::Library& m) {
  m.def(Op::kSchema);
}

template <class Op>
void check_first(torch::Library& m) {
  m.impl(Op::kName, &Checked<Op>::call);
}

}  // namespace front
}  // namespace qtrain
