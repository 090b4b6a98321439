// load_and_run MODEL.pt INPUT.bin ROWS COLS OUTPUT.bin [OP_LIBRARY.so]
//
// Loads the op library (if given) with dlopen, which registers torch.ops.ops.* through its
// TORCH_LIBRARY blocks; loads a TorchScript model; runs forward on a float32 ROWS x COLS input read
// from INPUT.bin (raw, row-major); writes the float32 output raw to OUTPUT.bin and its shape to stdout.
// With LOAD_AND_RUN_GRAD=1 in the environment it writes d(sum(output))/d(input) instead (autograd in
// C++, through the ops' C++ autograd kernels), shaped like the input.
// Exit codes: 0 ok, 1 usage, 2 TorchScript error (e.g. "Unknown builtin op" without the op library),
// 3 the op library failed to load, 4 file I/O.
#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <torch/script.h>

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::cerr << "usage: " << argv[0] << " MODEL.pt INPUT.bin ROWS COLS OUTPUT.bin [OP_LIBRARY.so]\n";
    return 1;
  }
  if (argc == 7 && dlopen(argv[6], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::cerr << "failed to load the op library " << argv[6] << ": " << dlerror() << "\n";
    return 3;
  }
  const int64_t rows = std::atoll(argv[3]);
  const int64_t cols = std::atoll(argv[4]);
  std::vector<float> input(static_cast<size_t>(rows * cols));
  std::ifstream in(argv[2], std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(input.data()), static_cast<std::streamsize>(input.size() * sizeof(float)))) {
    std::cerr << "cannot read " << rows << "x" << cols << " floats from " << argv[2] << "\n";
    return 4;
  }
  try {
    torch::jit::Module model = torch::jit::load(argv[1]);
    model.eval();
    const char* grad_env = std::getenv("LOAD_AND_RUN_GRAD");
    const bool grad = grad_env != nullptr && std::string(grad_env) == "1";
    torch::Tensor x = torch::from_blob(input.data(), {rows, cols}, torch::kFloat32);
    torch::Tensor y;
    if (grad) {
      x = x.clone().requires_grad_(true);
      model.forward({x}).toTensor().sum().backward();
      y = x.grad().contiguous();
    } else {
      torch::NoGradGuard no_grad;
      y = model.forward({x}).toTensor().to(torch::kFloat32).contiguous();
    }
    std::ofstream out(argv[5], std::ios::binary);
    out.write(reinterpret_cast<const char*>(y.data_ptr<float>()),
              static_cast<std::streamsize>(y.numel() * sizeof(float)));
    if (!out) {
      std::cerr << "cannot write " << argv[5] << "\n";
      return 4;
    }
    std::cout << y.size(0) << " " << y.size(1) << "\n";
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 2;
  } catch (const std::exception& e) {  // e.g. torch::jit::ErrorReport while loading
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
