// Private introspection ops (leading underscore): build facts, the CUTLASS instantiation list, and a
// test hook for the CUTLASS GEMM host path. They return JSON strings so that the op library needs no
// Python (it is also loaded by C++ programs, tests/cpp/); ops/_library.py decodes them.
#include <cstdio>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/library.h>

#include "../cutlass_gemm/gemm_host.h"
#include "../cutlass_gemm/plan.h"
#include "checks.h"
#include "json.h"

namespace ops {
namespace {

namespace cg = cutlass_gemm;

JsonObject operand_json(const cg::OperandPlan& p) {
  JsonObject o;
  o.add("source", p.source == cg::Source::InPlace ? "in_place" : "copy")
      .add("layout", cg::layout_name(p.layout))
      .add("rows", p.rows)
      .add("cols", p.cols)
      .add("ld", p.ld);
  return o;
}

std::string plan_json(const cg::GemmPlan& plan) {
  JsonObject o;
  if (plan.kernel == cg::KernelId::kCount) {
    o.null("kernel");
    return o.str();
  }
  o.add("kernel", cg::kernel_info(plan.kernel).name)
      .add("swap_ab", plan.swap_ab)
      .add("m", plan.m)
      .add("n", plan.n)
      .add("k", plan.k)
      .add("a", operand_json(plan.a))
      .add("b", operand_json(plan.b))
      .add("d", operand_json(plan.d))
      .add("copied_elements", plan.copied_elements);
  return o.str();
}

// The real host path of the CUDA wrapper (checks, plan, copies, zero padding, output temporary,
// copy-back) on CPU tensors, with the CUTLASS launch replaced by an exact replay of its descriptor.
// epilogue: "plain" (cutlass_gemm) or an ops.linear activation (Bias<Act> kernels, with `bias`).
std::string gemm_emulate(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out,
                         int64_t cc_major, int64_t cc_minor, c10::string_view arch_list,
                         bool allow_tf32, bool poison, const c10::optional<at::Tensor>& bias,
                         c10::string_view epilogue) {
  check_gemm_inputs("cutlass_gemm", A, B);
  TORCH_CHECK(!check_gemm_out("cutlass_gemm", A, B, out),
              "cutlass_gemm emulation: out shares A's or B's buffer (the real op computes into a temporary)");
  TORCH_CHECK(A.device().is_cpu(), "cutlass_gemm emulation runs on CPU tensors, got ", A.device());
  cg::DeviceTarget target;
  target.cc_major = static_cast<int>(cc_major);
  target.cc_minor = static_cast<int>(cc_minor);
  try {
    target.built = cg::parse_arch_list(std::string(arch_list));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "cutlass_gemm: ", e.what());
  }
  target.allow_tf32 = allow_tf32;
  const auto dtype = A.scalar_type();
  const cg::GemmPlan plan = cg::gemm_into(
      A, B, out, target,
      [&](const cg::GemmPlan& p, const cg::GemmLaunchArgs& args) { cg::emulate_launch(p, args, dtype); },
      poison,
      epilogue == "plain" ? cg::Epilogue::Plain : cg::epilogue_for_activation("linear", epilogue),
      bias.has_value() ? *bias : at::Tensor());
  return plan_json(plan);
}

std::string kernels_json() {
  std::string out = "[";
  for (int i = 0; i < cg::kNumKernels; ++i) {
    const cg::KernelInfo& info = cg::kKernels[i];
    JsonObject o;
    o.add("name", info.name)
        .add("sm", info.sm)
        .add("dtype", cg::dtype_name(info.dtype))
        .add("math", cg::math_name(info.math))
        .add("layout_a", cg::layout_name(info.a))
        .add("layout_b", cg::layout_name(info.b))
        .add("alignment", info.alignment)
        .add("on_sm90", info.on_sm90)
        .add("epilogue", cg::epilogue_name(info.epilogue));
    out += (i ? "," : "") + o.str();
  }
  return out + "]";
}

std::string build_info_json() {
  JsonObject o;
  o.add("with_cuda", static_cast<bool>(OPS_WITH_CUDA))
      .add("cuda_arch_list", OPS_CUDA_ARCH_LIST)
      .add("cutlass_version", OPS_CUTLASS_VERSION)
      .add("torch_version", OPS_TORCH_VERSION)
      .add("cuda_version", OPS_CUDA_VERSION);
  return o.str();
}

bool allow_tf32() { return at::globalContext().allowTF32CuBLAS(); }

}  // namespace
}  // namespace ops

TORCH_LIBRARY_FRAGMENT(ops, m) {
  m.def("_build_info() -> str", &ops::build_info_json);
  m.def("_cutlass_gemm_kernels() -> str", &ops::kernels_json);
  m.def("_allow_tf32() -> bool", &ops::allow_tf32);
  m.def("_cutlass_gemm_emulate(Tensor A, Tensor B, Tensor(a!) out, int cc_major, int cc_minor, "
        "str arch_list, bool allow_tf32, bool poison=True, Tensor? bias=None, str epilogue=\"plain\") -> str",
        &ops::gemm_emulate);
}
