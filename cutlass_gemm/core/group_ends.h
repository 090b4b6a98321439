// The group ends of a grouped GEMM (checks.h GroupedMode): read on the host (grouped_gemm's and
// scaled_grouped_gemm's loops over their groups), or clamped on the device (their device paths); and what
// torch's grouped GEMMs need around them (layouts, the output they leave unwritten).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
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

// A view torch's grouped GEMMs take (torch's check_valid_strides_and_return_transposed): one of the last two
// strides 1, the other a multiple of 16 bytes and at least the extent, 16-byte aligned data and batch stride.
inline bool torch_grouped_layout(const at::Tensor& t) {
  const int64_t align = 16 / t.element_size(), d = t.dim() - 1;
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  if (t.dim() == 3 && t.stride(0) % align != 0) return false;
  if (t.stride(d - 1) == 1 && t.stride(d) >= std::max<int64_t>(1, t.size(d - 1))) return t.stride(d) % align == 0;
  if (t.stride(d) == 1 && t.stride(d - 1) >= std::max<int64_t>(1, t.size(d))) return t.stride(d - 1) % align == 0;
  return false;
}

// 2D x 2D operands torch._scaled_grouped_mm's FP8 kernel takes whatever the offsets: FP8 reads both K-major,
// and for that layout its prepare kernel asserts on the device (a sticky error; GroupMMCommon.cuh,
// prepare_grouped_gemm_data) that every group spans more than 0 of K and, but for the last, a multiple of 16.
// Each group's columns of A and rows of B start at a multiple of 16 with zeros after them, at least 16 per group
// (an empty group's product: 0); the K past the last end follows. a (M, L) row-major, b (L, N) column-major,
// L = K + 16 G rounded up to 16; ends: the groups' new ends (int32). ATen ops on A's device, no synchronization.
struct PaddedRaggedK {
  at::Tensor a, b, ends;
};
inline PaddedRaggedK pad_ragged_k(const at::Tensor& A, const at::Tensor& B, const at::Tensor& offs) {
  const int64_t K = A.size(1), G = offs.size(0);
  TORCH_CHECK(G > 0, "pad_ragged_k: no group");
  const at::Tensor ends = device_group_ends(offs.to(at::kLong), K);
  const at::Tensor sizes = at::diff(ends, 1, 0, at::zeros({1}, ends.options()));
  const at::Tensor padded = at::clamp_min(at::div(sizes + 15, 16, "floor") * 16, 16);
  const at::Tensor padded_ends = at::cumsum(padded, 0);
  // Column k, after g ends (g = G: past the last one), moves by shift[g].
  const at::Tensor shift = at::cat({padded_ends - padded - (ends - sizes), (padded_ends - ends).narrow(0, G - 1, 1)});
  const at::Tensor k = at::arange(K, ends.options());
  const at::Tensor dest = k + shift.index_select(0, at::searchsorted(ends, k, /*out_int32=*/false, /*right=*/true));
  const int64_t L = (K + 16 * G + 15) / 16 * 16;
  at::Tensor a = at::zeros({A.size(0), L}, A.options().dtype(at::kByte));
  a.index_copy_(1, dest, A.view(at::kByte));
  at::Tensor bt = at::zeros({B.size(1), L}, B.options().dtype(at::kByte));
  bt.index_copy_(1, dest, B.t().view(at::kByte));
  return {a.view(A.scalar_type()), bt.view(B.scalar_type()).t(), padded_ends.to(at::kInt)};
}

// Zeros what torch's grouped GEMMs leave unwritten: output rows (RaggedM) or columns (RaggedN) past the last
// group end, and the whole output of an empty group (RaggedK). `ends`: device_group_ends.
inline void zero_outside_groups(at::Tensor& out, const at::Tensor& ends, const GroupedProblem& p) {
  if (p.mode == GroupedMode::Batched) return;
  if (p.mode == GroupedMode::RaggedK) {
    const at::Tensor sizes = at::diff(ends, 1, 0, at::zeros({1}, ends.options()));
    out.masked_fill_((sizes == 0).view({p.groups, 1, 1}), 0);
    return;
  }
  const at::Tensor last = p.groups ? ends.narrow(0, p.groups - 1, 1) : at::zeros({1}, ends.options());
  const at::Tensor outside = at::arange(p.extent, ends.options()) >= last;
  out.masked_fill_(p.mode == GroupedMode::RaggedM ? outside.unsqueeze(1) : outside.unsqueeze(0), 0);
}

}  // namespace ops::cutlass_gemm
