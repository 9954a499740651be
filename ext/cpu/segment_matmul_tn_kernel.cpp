// segment_matmul_tn on the CPU (front: ops/segment_matmul_tn.cpp; reference
// qtrain/ops/typed.py reference_segment_matmul_tn): the host loop of
// common/segment_matmul.h, one at::mm_out per nonempty segment.
#include <torch/library.h>

#include "common/segment_matmul.h"

TORCH_LIBRARY_IMPL(qtrain, CPU, m) { m.impl("segment_matmul_tn", &qtrain::segment_matmul::tn); }
