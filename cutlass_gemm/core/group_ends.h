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

// `t`, or a contiguous copy where it is not a row-major view torch's grouped GEMMs take.
inline at::Tensor torch_row_major(const at::Tensor& t) {
  return t.stride(-1) == 1 && torch_grouped_layout(t) ? t : t.contiguous();
}

// offs's groups over an extent moved to starts at multiples of 16, each at least 16 wide with zeros after it,
// the extent past the last end following (torch._scaled_grouped_mm's FP8 kernel asserts on the device that the
// groups it cuts along a TMA-strided dimension span multiples of 16 bytes; an empty group's product is then 0
// there): dest, each index's new index (int64); ends, the new group ends (int32); clamped, device_group_ends;
// width, extent + 16 G rounded up to 16. ATen ops on offs's device, no synchronization.
struct AlignedGroups {
  at::Tensor dest, ends, clamped;
  int64_t width;
};
inline AlignedGroups align_groups(const at::Tensor& offs, int64_t extent) {
  const int64_t G = offs.size(0);
  TORCH_CHECK(G > 0, "align_groups: no group");
  const at::Tensor ends = device_group_ends(offs.to(at::kLong), extent);
  const at::Tensor sizes = at::diff(ends, 1, 0, at::zeros({1}, ends.options()));
  const at::Tensor padded = at::clamp_min(at::div(sizes + 15, 16, "floor") * 16, 16);
  const at::Tensor padded_ends = at::cumsum(padded, 0);
  // Index i, after g ends (g = G: past the last one), moves by shift[g].
  const at::Tensor shift = at::cat({padded_ends - padded - (ends - sizes), (padded_ends - ends).narrow(0, G - 1, 1)});
  const at::Tensor i = at::arange(extent, ends.options());
  const at::Tensor dest = i + shift.index_select(0, at::searchsorted(ends, i, /*out_int32=*/false, /*right=*/true));
  return {dest, padded_ends.to(at::kInt), ends, (extent + 16 * G + 15) / 16 * 16};
}

// `t` with its slices along `dim` at their aligned indices in zeros `groups.width` wide there (FP8 moved as bytes).
inline at::Tensor spread_groups(const at::Tensor& t, int64_t dim, const AlignedGroups& groups) {
  const bool fp8 = t.scalar_type() == at::kFloat8_e4m3fn;
  const at::Tensor source = fp8 ? t.view(at::kByte) : t;
  std::vector<int64_t> sizes = source.sizes().vec();
  sizes[dim] = groups.width;
  at::Tensor spread = at::zeros(sizes, source.options());
  spread.index_copy_(dim, groups.dest, source);
  return fp8 ? spread.view(t.scalar_type()) : spread;
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
