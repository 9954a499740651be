// segment_matmul on the CPU (front: ops/segment_matmul.cpp; reference qtrain/ops/typed.py
// reference_segment_matmul): the host loop of common/segment_matmul.h, one at::mm_out
// (MKL / oneDNN, torch's threads) per nonempty segment.
#include <torch/library.h>

#include "common/segment_matmul.h"

TORCH_LIBRARY_IMPL(qtrain, CPU, m) {
  m.impl("segment_matmul", &qtrain::segment_matmul::forward);
}
