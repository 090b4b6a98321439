// The device a GEMM is planned for: the real GPU (gemm_cuda.cpp, current_device_target) or an
// emulated one (introspection_ops.cpp). Plain C++.
#pragma once

#include <string>
#include <vector>

#include "plan.h"

namespace ops::cutlass_gemm {

struct DeviceTarget {
  int cc_major = 0, cc_minor = 0;
  std::vector<BuiltArch> built;
  bool allow_tf32 = false;
  int sm_count = 132;  // multiprocessors (the tactic heuristic's wave size)
  // The device model (cudaDeviceProp::name; "emulated" for the CPU emulation): tuning-cache keys name
  // the model, not the ordinal, so a saved cache applies to every GPU of that model.
  std::string name = "emulated";
  // GemmRequest::sm80_on_sm90 (the environment variable OPS_CUTLASS_SM80_ON_SM90=1: sm80_on_sm90_from_env).
  bool sm80_on_sm90 = false;
  // GemmRequest::candidates_built: OPS_WITH_CANDIDATE_KERNELS for the device; chosen by the emulation.
  bool candidates_built = false;
};

// Whether the environment asks for the SM80 kernels on Hopper (OPS_CUTLASS_SM80_ON_SM90=1).
bool sm80_on_sm90_from_env();

}  // namespace ops::cutlass_gemm
