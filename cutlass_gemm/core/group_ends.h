// The group ends of a grouped GEMM (checks.h GroupedMode): read on the host (grouped_gemm's and
// scaled_grouped_gemm's loops over their groups), or clamped on the device (their device paths).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "../../csrc/checks.h"

namespace ops::cutlass_gemm {

// offs's values, checked (check_group_offsets); none for Batched. On CUDA a copy to the host, synchronizing
// with the stream.
inline std::vector<int32_t> group_ends(const char* op, const GroupedProblem& p, const c10::optional<at::Tensor>& offs) {
  if (p.mode == GroupedMode::Batched) return {};
  const at::Tensor host = offs->to(at::kCPU);
  std::vector<int32_t> ends(host.data_ptr<int32_t>(), host.data_ptr<int32_t>() + p.groups);
  check_group_offsets(op, p, ends.data());
  return ends;
}

// offs's ends as the grouped kernels read them (kernels/grouped_args.h clamped_offset): each clamped into
// [0, extent], then the running maximum, by ATen ops on offs's device (no synchronization).
inline at::Tensor device_group_ends(const at::Tensor& offs, int64_t extent) {
  return std::get<0>(at::cummax(offs.clamp(0, extent), 0));
}

}  // namespace ops::cutlass_gemm
