// scatter_rows_add on CUDA (front: ops/scatter_rows_add.cpp; reference qtrain/ops/scatter.py
// reference_scatter_rows_add; CPU twin cpu/scatter_rows_add_kernel.cpp): the transposed
// product of a 0/1 CSR matrix over a block of its rows, added into out.
//
//   out[indices[k]] += x[r]        r = 0 .. R - 1, k = indptr[r] .. indptr[r + 1]
//
// Source-row parallel: a group of G lanes (G = 1 .. 32, a power of two, from the width D)
// owns one row r of x and walks its entries, each lane owning the features lane, lane + G,
// ...; each addition is a float32 atomicAdd into out[indices[k]]. Summation order: the
// additions into one output row come from many groups in an order the hardware picks, so
// unlike the CPU kernel the result is not fixed bit for bit from run to run; every addition
// is one IEEE float32 add, so it equals the reference to float32 rounding (exactly wherever
// the sums are exact, e.g. small integers).
//
// indptr may be a row range of a larger CSR (indptr[a : b + 1] with the whole indices): it is
// read as int64 (converted if int32: R + 1 entries) and indices in its own dtype (promoting it
// would copy the whole CSR's entries per call); only indices[indptr[0] .. indptr[R]) is
// read. What only the data shows is found by a validation kernel before anything is added:
// indptr[0] < 0, a decrease, indptr[R] > indices.numel(), an index outside [0, N). It sets a
// device flag (with the first decreasing row and the first bad entry beside it) that the
// scatter kernel reads on the device, adding nothing when it is set, so out is left as it
// was; the host reads the flag back once after both launches (read_back: the op's one sync)
// and raises the CPU kernel's ValueError, checked in the CPU kernel's order. Only a failure
// reads more (the offending value).
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common.cuh"

namespace qtrain {
namespace cuda {
namespace {

constexpr const char* kFn = "qtrain::scatter_rows_add";
constexpr int kThreads = 256;
constexpr int kBadFirst = 1;  // indptr[0] < 0
constexpr int kBadOrder = 2;  // indptr decreases somewhere
constexpr int kBadLast = 4;   // indptr[R] > the number of entries of indices
constexpr int kBadIndex = 8;  // an entry of the range outside [0, N)

// The device flag, as the validation kernel writes it and the host reads it back.
struct Flags {
  unsigned long long bad;       // kBad* bits; the scatter kernel adds nothing unless 0
  unsigned long long decrease;  // rows - r for the first r with indptr[r + 1] < indptr[r]
  unsigned long long index;     // nnz - k for the first entry k outside [0, N) (0: none)
};

// Grid-stride over indptr's rows and over the entries the range reads (clamped to indices:
// with a bad indptr the entries are not reported anyway). Each thread walks its items in
// ascending order, so the first bad one it meets is its smallest: one atomic per thread.
template <typename I>
__global__ void __launch_bounds__(kThreads)
    validate_kernel(const int64_t* __restrict__ ip, int64_t rows, const I* __restrict__ ix,
                    int64_t nnz, int64_t n_out, Flags* __restrict__ flag) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = ip[0];
  const int64_t last = ip[rows];
  int bad = 0;
  if (tid == 0) {
    if (first < 0) bad |= kBadFirst;
    if (last > nnz) bad |= kBadLast;
  }
  for (int64_t r = tid; r < rows; r += stride) {
    if (ip[r + 1] < ip[r]) {
      bad |= kBadOrder;
      atomicMax(&flag->decrease, static_cast<unsigned long long>(rows - r));
      break;
    }
  }
  const int64_t lo = first > 0 ? first : 0;
  const int64_t hi = last < nnz ? last : nnz;
  for (int64_t k = lo + tid; k < hi; k += stride) {
    if (static_cast<uint64_t>(static_cast<int64_t>(ix[k])) >= static_cast<uint64_t>(n_out)) {
      bad |= kBadIndex;
      atomicMax(&flag->index, static_cast<unsigned long long>(nnz - k));
      break;
    }
  }
  if (bad != 0) atomicOr(&flag->bad, static_cast<unsigned long long>(bad));
}

// G lanes per row r of x: x[r] added into out[indices[k]] for every entry k of the row.
template <typename I, int G>
__global__ void __launch_bounds__(kThreads)
    scatter_kernel(const int64_t* __restrict__ ip, int64_t rows, const I* __restrict__ ix,
                   const float* x, float* out, int64_t D, const Flags* __restrict__ flag) {
  if (flag->bad != 0) return;  // the validation kernel refused the data: out stays as it was
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / G;
  if (r >= rows) return;
  const int64_t lane = static_cast<int64_t>(threadIdx.x % G);
  const int64_t b = ip[r];
  const int64_t e = ip[r + 1];
  const float* s = x + r * D;
  for (int64_t k = b; k < e; ++k) {
    float* o = out + static_cast<int64_t>(ix[k]) * D;
    for (int64_t f = lane; f < D; f += G) atomicAdd(o + f, s[f]);
  }
}

template <typename I, int G>
void launch_g(const int64_t* ip, int64_t rows, const I* ix, const float* x, float* out, int64_t D,
              const Flags* flag, cudaStream_t stream) {
  const int64_t blocks = (rows * G + kThreads - 1) / kThreads;
  TORCH_CHECK_VALUE(blocks <= int64_t{0x7fffffff}, kFn, ": too many rows (", rows, ")");
  scatter_kernel<I, G>
      <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(ip, rows, ix, x, out, D, flag);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Validation, then the scatter (group size from the width: one lane per feature up to a
// warp), then the one read-back of the flag, turned into the CPU kernel's ValueError.
template <typename I>
void run(const at::Tensor& out, const at::Tensor& indptr, const at::Tensor& indices,
         const at::Tensor& x, Flags* flag, cudaStream_t stream) {
  const int64_t* ip = indptr.const_data_ptr<int64_t>();
  const I* ix = static_cast<const I*>(indices.const_data_ptr());
  const int64_t rows = indptr.numel() - 1;
  const int64_t nnz = indices.numel();
  const int64_t N = out.size(0);
  const int64_t D = out.size(1);
  const unsigned grid = grid_for(std::max<int64_t>({rows, nnz, 1}), kThreads);
  validate_kernel<I><<<grid, kThreads, 0, stream>>>(ip, rows, ix, nnz, N, flag);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (rows > 0 && D > 0) {
    const float* xp = x.const_data_ptr<float>();
    float* op = out.mutable_data_ptr<float>();
    if (D <= 1) {
      launch_g<I, 1>(ip, rows, ix, xp, op, D, flag, stream);
    } else if (D <= 2) {
      launch_g<I, 2>(ip, rows, ix, xp, op, D, flag, stream);
    } else if (D <= 4) {
      launch_g<I, 4>(ip, rows, ix, xp, op, D, flag, stream);
    } else if (D <= 8) {
      launch_g<I, 8>(ip, rows, ix, xp, op, D, flag, stream);
    } else if (D <= 16) {
      launch_g<I, 16>(ip, rows, ix, xp, op, D, flag, stream);
    } else {
      launch_g<I, 32>(ip, rows, ix, xp, op, D, flag, stream);
    }
  }
  const Flags f = read_back(flag, stream);
  const int bad = static_cast<int>(f.bad);
  if (bad == 0) return;
  TORCH_CHECK_VALUE((bad & kBadFirst) == 0, kFn, ": indptr[0] must be >= 0, got ",
                    read_back(ip, stream));
  const int64_t r = rows - static_cast<int64_t>(f.decrease);
  TORCH_CHECK_VALUE((bad & kBadOrder) == 0, kFn, ": indptr must be non-decreasing, but indptr[",
                    r + 1, "] < indptr[", r, "]");
  TORCH_CHECK_VALUE((bad & kBadLast) == 0, kFn,
                    ": indptr[-1] must be at most the number of entries of indices (", nnz,
                    "), got ", read_back(ip + rows, stream));
  const int64_t k = nnz - static_cast<int64_t>(f.index);
  TORCH_CHECK_VALUE(false, kFn, ": indices[", k, "] = ",
                    static_cast<int64_t>(read_back(ix + k, stream)), " is outside [0, ", N,
                    ") (the rows of out)");
}

void scatter_rows_add(const at::Tensor& out, const at::Tensor& indptr_in,
                      const at::Tensor& indices_in, const at::Tensor& x_in) {
  const c10::cuda::CUDAGuard guard(out.device());
  const at::Tensor indptr = indptr_in.to(at::kLong).contiguous();
  const at::Tensor indices = indices_in.contiguous();
  const at::Tensor x = x_in.contiguous();
  at::Tensor flag = at::zeros({3}, out.options().dtype(at::kLong));
  Flags* f = reinterpret_cast<Flags*>(flag.mutable_data_ptr<int64_t>());
  const cudaStream_t stream = current_stream();
  if (indices.scalar_type() == at::kLong) {
    run<int64_t>(out, indptr, indices, x, f, stream);
  } else {
    run<int32_t>(out, indptr, indices, x, f, stream);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace qtrain

TORCH_LIBRARY_IMPL(qtrain, CUDA, m) {
  m.impl("scatter_rows_add", &qtrain::cuda::scatter_rows_add);
}
