// The Python extension module `ops._C`: loading it registers the ops (TORCH_LIBRARY in this .so).
// Besides the ops it exposes build facts and test hooks for the CUTLASS GEMM planner, which is plain
// host code and is checked on CPU (tests/test_gemm_plan.py).
#include <ATen/Context.h>
#include <torch/extension.h>

#include "../csrc/checks.h"
#include "../cutlass_gemm/gemm_host.h"
#include "../cutlass_gemm/plan.h"

#ifndef OPS_WITH_CUDA
#define OPS_WITH_CUDA 0
#endif
#ifndef OPS_CUDA_ARCH_LIST
#define OPS_CUDA_ARCH_LIST ""
#endif
#ifndef OPS_CUTLASS_VERSION
#define OPS_CUTLASS_VERSION ""
#endif
#ifndef OPS_TORCH_VERSION
#define OPS_TORCH_VERSION ""
#endif
#ifndef OPS_CUDA_VERSION
#define OPS_CUDA_VERSION ""
#endif

namespace py = pybind11;
namespace cg = ops::cutlass_gemm;

namespace {

py::dict operand_dict(const cg::OperandPlan& p) {
  py::dict d;
  d["source"] = p.source == cg::Source::InPlace ? "in_place" : "copy";
  d["layout"] = cg::layout_name(p.layout);
  d["rows"] = p.rows;
  d["cols"] = p.cols;
  d["ld"] = p.ld;
  return d;
}

py::dict plan_dict(const cg::GemmPlan& plan) {
  py::dict d;
  const bool launched = plan.kernel != cg::KernelId::kCount;
  d["kernel"] = launched ? py::object(py::str(cg::kernel_info(plan.kernel).name)) : py::none();
  if (!launched) return d;
  d["swap_ab"] = plan.swap_ab;
  d["m"] = plan.m;
  d["n"] = plan.n;
  d["k"] = plan.k;
  d["a"] = operand_dict(plan.a);
  d["b"] = operand_dict(plan.b);
  d["d"] = operand_dict(plan.d);
  d["copied_elements"] = plan.copied_elements;
  return d;
}

cg::DeviceTarget make_target(int cc_major, int cc_minor, const std::string& arch_list,
                             bool allow_tf32) {
  cg::DeviceTarget target;
  target.cc_major = cc_major;
  target.cc_minor = cc_minor;
  try {
    target.built = cg::parse_arch_list(arch_list);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "cutlass_gemm: ", e.what());
  }
  target.allow_tf32 = allow_tf32;
  return target;
}

// Runs the real host path (checks, plan, copies, temporaries, copy-back) on CPU tensors, with the
// CUTLASS launch replaced by an exact replay of its descriptor (cg::emulate_launch).
py::dict emulate(const at::Tensor& A, const at::Tensor& B, const at::Tensor& out, int cc_major,
                 int cc_minor, const std::string& arch_list, bool allow_tf32, bool poison) {
  ops::check_gemm_inputs("cutlass_gemm", A, B);
  ops::check_gemm_out("cutlass_gemm", A, B, out);
  TORCH_CHECK(A.device().is_cpu(), "cutlass_gemm emulation runs on CPU tensors");
  const auto dtype = A.scalar_type();
  const cg::GemmPlan plan = cg::gemm_into(
      A, B, out, make_target(cc_major, cc_minor, arch_list, allow_tf32),
      [&](const cg::GemmPlan& p, const cg::GemmLaunchArgs& args) { cg::emulate_launch(p, args, dtype); },
      poison);
  return plan_dict(plan);
}

py::list kernels() {
  py::list out;
  for (const cg::KernelInfo& info : cg::kKernels) {
    py::dict d;
    d["name"] = info.name;
    d["sm"] = info.sm;
    d["dtype"] = cg::dtype_name(info.dtype);
    d["math"] = cg::math_name(info.math);
    d["layout_a"] = cg::layout_name(info.a);
    d["layout_b"] = cg::layout_name(info.b);
    d["alignment"] = info.alignment;
    d["on_sm90"] = info.on_sm90;
    out.append(d);
  }
  return out;
}

py::dict build_info() {
  py::dict d;
  d["with_cuda"] = static_cast<bool>(OPS_WITH_CUDA);
  d["cuda_arch_list"] = OPS_CUDA_ARCH_LIST;
  d["cutlass_version"] = OPS_CUTLASS_VERSION;
  d["torch_version"] = OPS_TORCH_VERSION;
  d["cuda_version"] = OPS_CUDA_VERSION;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Compiled half of the `ops` package: registers torch.ops.ops.* and exposes build facts.";
  m.def("build_info", &build_info, "Facts recorded when this library was compiled.");
  m.def("kernels", &kernels, "The CUTLASS GEMM instantiations (cutlass_gemm/kernel_list.h).");
  m.def("allow_tf32", [] { return at::globalContext().allowTF32CuBLAS(); },
        "Whether torch's float32 matmul precision currently allows TF32 (what cutlass_gemm follows).");
  m.def("_gemm_emulate", &emulate, py::arg("A"), py::arg("B"), py::arg("out"), py::arg("cc_major"),
        py::arg("cc_minor"), py::arg("arch_list"), py::arg("allow_tf32"), py::arg("poison") = true,
        "Test hook: the CUTLASS GEMM host path on CPU tensors with an emulated launch; returns the plan.");
}
