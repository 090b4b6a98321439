// The group ends of a grouped GEMM (checks.h GroupedMode), read on the host: grouped_gemm's and
// scaled_grouped_gemm's loops over their groups.
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

}  // namespace ops::cutlass_gemm
