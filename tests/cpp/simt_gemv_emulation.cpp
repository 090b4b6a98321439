// The SIMT GEMV kernel (cutlass_gemm/kernels/simt_gemv.cuh) on emulated warps (warp_emulation.h), through its
// real host entry point simt_gemv::run<KernelId>: every row-count variant (M = 1..16), N and K that do not
// fill a block or a warp's K step, padded leading dimensions, every epilogue with and without a bias.
// Inputs are small integers (and halves), so the fp32 sums are exact and each output must equal the
// float64 product rounded the same way: a wrong index, a lost partial sum or a missed K chunk shows.
// Operands are allocated to their exact extent ((rows - 1) * ld + K elements), so any read past them
// aborts; D is poisoned with NaN, its padding and 64 elements past it must stay NaN.
// Built and run by tests/test_simt_gemv_emulation.py. Prints "<cases> cases, <failures> failures".
#define OPS_SIMT_GEMV_HOST_EMULATION 1
#include "tests/cpp/warp_emulation.h"
#include "cutlass_gemm/kernels/simt_gemv.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace ops::cutlass_gemm;

namespace {

template <typename T>
T* aligned_copy(const std::vector<T>& v) {
  const size_t bytes = (v.size() * sizeof(T) + 15) / 16 * 16;
  T* p = static_cast<T*>(std::aligned_alloc(16, bytes));
  std::memcpy(p, v.data(), v.size() * sizeof(T));
  return p;
}

// Number of wrong elements (the first few printed).
template <KernelId kId>
int run_case(int M, int N, int K, int pad_a, int pad_b, int pad_d, bool with_bias, std::mt19937& rng) {
  using Element = typename KernelTraits<kId>::Element;
  constexpr Epilogue kEpilogue = kernel_info(kId).epilogue;
  using Activation = typename ActivationFor<kEpilogue, float>::type;
  const int64_t lda = K + pad_a, ldb = K + pad_b, ldd = N + pad_d;
  std::vector<Element> A(static_cast<size_t>((M - 1) * lda + K)), B(static_cast<size_t>((N - 1) * ldb + K));
  std::vector<Element> D(static_cast<size_t>(M * ldd + 64), Element(NAN)), bias(N);
  std::uniform_int_distribution<int> small(-3, 3);
  for (Element& x : A) x = Element(static_cast<float>(small(rng)));
  for (Element& x : B) x = Element(0.5f * static_cast<float>(small(rng)));
  for (Element& x : bias) x = Element(static_cast<float>(small(rng)));
  Element* a = aligned_copy(A);
  Element* b = aligned_copy(B);
  emulation::allow_reads({{reinterpret_cast<const char*>(a), A.size() * sizeof(Element)},
                          {reinterpret_cast<const char*>(b), B.size() * sizeof(Element)}});
  GemmLaunchArgs args;
  args.a = a;
  args.b = b;
  args.d = D.data();
  args.m = M;
  args.n = N;
  args.k = K;
  args.lda = lda;
  args.ldb = ldb;
  args.ldd = ldd;
  args.bias = with_bias ? bias.data() : nullptr;
  const LaunchStatus status = simt_gemv::run<kId>(args, nullptr);
  int wrong = 0;
  if (!status.ok) {
    std::printf("%s rejected M=%d N=%d K=%d: %s\n", kernel_info(kId).id, M, N, K, status.message);
    wrong = 1;
  }
  for (int r = 0; status.ok && r < M; ++r) {
    for (int64_t c = 0; c < ldd; ++c) {
      const float got = static_cast<float>(D[r * ldd + c]);
      float expected = NAN;
      if (c < N) {
        double sum = 0;
        for (int k = 0; k < K; ++k) {
          sum += static_cast<double>(static_cast<float>(A[r * lda + k])) * static_cast<float>(B[c * ldb + k]);
        }
        if (kEpilogue != Epilogue::Plain && with_bias) sum += static_cast<float>(bias[c]);
        expected = static_cast<float>(Element(Activation()(static_cast<float>(sum))));
      }
      const bool ok = std::isnan(expected) ? std::isnan(got) : got == expected;
      if (!ok && wrong++ < 3) {
        std::printf("%s M=%d N=%d K=%d lda=%ld ldb=%ld ldd=%ld bias=%d: D[%d, %ld] = %g, expected %g\n",
                    kernel_info(kId).id, M, N, K, static_cast<long>(lda), static_cast<long>(ldb),
                    static_cast<long>(ldd), with_bias, r, static_cast<long>(c), got, expected);
      }
    }
  }
  for (size_t i = static_cast<size_t>(M * ldd); i < D.size(); ++i) {
    if (!std::isnan(static_cast<float>(D[i])) && wrong++ < 3) std::printf("%s wrote past D\n", kernel_info(kId).id);
  }
  std::free(a);
  std::free(b);
  return wrong;
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  int cases = 0, failures = 0;
  const auto count = [&](int wrong) {
    ++cases;
    failures += wrong != 0;
  };
  // Every row-count variant (1, 2, 4, 8, 16 and the M it rounds up), N filling no block (16 columns)
  // or warp (4 columns), K below, at and past a warp's 256-element step and its unrolled loop.
  for (int M = 1; M <= 16; ++M) {
    for (int N : {3, 17, 44}) {
      for (int K : {8, 264, 1032, 2312}) {
        const int pad_a = (M + N) % 3 * 8, pad_b = (N + K) % 2 * 8, pad_d = (M * N) % 3;
        count(run_case<KernelId::sm90_bf16_rc_gemv>(M, N, K, pad_a, pad_b, pad_d, false, rng));
        count(run_case<KernelId::sm90_f16_rc_gemv>(M, N, K, pad_a, pad_b, pad_d, false, rng));
      }
    }
  }
  // The ops.linear epilogues, with and without a bias.
  for (int M : {1, 3, 9, 16}) {
    for (int K : {264, 1032}) {
      for (bool with_bias : {false, true}) {
        count(run_case<KernelId::sm90_bf16_rc_none_gemv>(M, 44, K, 0, 0, 0, with_bias, rng));
        count(run_case<KernelId::sm90_f16_rc_relu_gemv>(M, 44, K, 8, 0, 1, with_bias, rng));
        count(run_case<KernelId::sm90_bf16_rc_gelu_gemv>(M, 44, K, 0, 8, 0, with_bias, rng));
        count(run_case<KernelId::sm90_f16_rc_gelu_tanh_gemv>(M, 44, K, 0, 0, 2, with_bias, rng));
        count(run_case<KernelId::sm90_bf16_rc_silu_gemv>(M, 44, K, 0, 0, 0, with_bias, rng));
      }
    }
  }
  std::printf("%d cases, %d failures\n", cases, failures);
  return failures != 0;
}
