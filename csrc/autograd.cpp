// Autograd kernels registered in C++.
//
// Every differentiable op (cutlass_gemm, linear, rms_norm, silu_and_mul) has its formulas here rather
// than in Python (torch.library.register_autograd), for two reasons: a Python autograd kernel costs a
// round trip through the interpreter on every call, with or without grad (~4-5 us, more than a
// 64x64x64 GEMM on a CPU), and C++ programs that load the library (tests/cpp) get differentiable ops
// too. Each is an ATen-style graph node (see
// CutlassGemmBackward) with a forward-mode formula as well.
//
// cutlass_gemm.out and fused_add_rms_norm write their arguments in place and are not differentiable.
// Like torch.mm(..., out=), with grad mode on and an argument that requires grad they raise, instead
// of silently producing a result with no history; otherwise they run the op below autograd and bump
// the written tensors' versions.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/dynamo/compiled_autograd.h>
#include <torch/library.h>

#include "checks.h"

namespace ops {
namespace {

const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&)>& cutlass_gemm_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::cutlass_gemm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op;
}

// The backward node of C = A B: dA = dC B^T, dB = A^T dC. Written the way ATen's generated autograd
// kernels are (a graph Node with SavedVariables, attached with set_history), not as a
// torch::autograd::Function: that is what torch.func transforms (grad, vjp, jacrev) support, and
// compiled autograd traces it like an ATen node (apply_with_saved). The backward calls the op itself
// (through the dispatcher, on transposed views, which the CUDA kernels read in place), so it is
// differentiable again: double backward works. Only what the needed gradients use is saved.
struct CutlassGemmBackward : public torch::autograd::TraceableFunction {
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    torch::autograd::variable_list result(2);
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return result;
    if (task_should_compute_output(0)) result[0] = cutlass_gemm_op().call(grad, B_.unpack().t());
    if (task_should_compute_output(1)) result[1] = cutlass_gemm_op().call(A_.unpack().t(), grad);
    return result;
  }

  std::string name() const override { return "CutlassGemmBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    A_.reset_data();
    B_.reset_data();
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.collect(A_, false);
    args.collect(B_, false);
  }

  torch::autograd::variable_list apply_with_saved(
      const torch::autograd::variable_list& grads,
      torch::dynamo::autograd::SwapSavedVariables& saved) override {
    saved.before(A_);
    saved.before(B_);
    torch::autograd::variable_list result = apply(torch::autograd::variable_list(grads));
    saved.after(A_);
    saved.after(B_);
    return result;
  }

  torch::autograd::SavedVariable A_;  // saved when B needs a gradient
  torch::autograd::SavedVariable B_;  // saved when A needs a gradient
};

at::Tensor cutlass_gemm_autograd(const at::Tensor& A, const at::Tensor& B) {
  // Only what autograd itself needs: the shape and dtype checks are the backend's and the fake
  // kernel's (reading sizes here would specialize symbolic shapes under torch.export / compile).
  check_gemm_defined("cutlass_gemm", A, B);
  c10::intrusive_ptr<CutlassGemmBackward> grad_fn;
  if (torch::autograd::compute_requires_grad(A, B)) {  // grad mode on and A or B requires grad
    grad_fn = c10::make_intrusive<CutlassGemmBackward>();
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(A, B));
    if (grad_fn->should_compute_output(1)) grad_fn->A_ = torch::autograd::SavedVariable(A, false);
    if (grad_fn->should_compute_output(0)) grad_fn->B_ = torch::autograd::SavedVariable(B, false);
  }
  at::Tensor C;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    C = cutlass_gemm_op().call(A, B);
  }
  if (grad_fn) torch::autograd::set_history(C, grad_fn);
  // Forward-mode AD (torch.autograd.forward_ad, torch.func.jvp / jacfwd): dC = dA B + A dB, by the op
  // on the primal values (through the dispatcher: differentiable again for forward-over-reverse).
  const at::Tensor dA = A._fw_grad(/*level=*/0);
  const at::Tensor dB = B._fw_grad(/*level=*/0);
  if (dA.defined() || dB.defined()) {
    at::Tensor dC;
    if (dA.defined()) dC = cutlass_gemm_op().call(dA, B._fw_primal(0));
    if (dB.defined()) {
      const at::Tensor term = cutlass_gemm_op().call(A._fw_primal(0), dB);
      dC = dC.defined() ? dC + term : term;
    }
    C._set_fw_grad(dC, /*level=*/0, /*is_inplace_op=*/false);
  }
  return C;
}

using LinearOp = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                             c10::string_view);

const c10::TypedOperatorHandle<LinearOp>& linear_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("ops::linear", "").typed<LinearOp>();
  return op;
}

// g * act'(z), elementwise, by ATen's own backward ops (themselves differentiable, so double backward
// works): threshold_backward (ReLU), gelu_backward (erf or tanh form), silu_backward (or its composite
// form when that must be differentiable).
at::Tensor activation_backward(const at::Tensor& g, const at::Tensor& z, const std::string& activation) {
  if (activation == "relu") return at::threshold_backward(g, z, 0);
  if (activation == "gelu") return at::gelu_backward(g, z, "none");
  if (activation == "gelu_tanh") return at::gelu_backward(g, z, "tanh");
  if (activation == "silu") {
    // aten::silu_backward has no derivative of its own; while a double-backward graph is being built,
    // use the composite form (as ATen's formula for silu does).
    if (!at::GradMode::is_enabled()) return at::silu_backward(g, z);
    const at::Tensor s = at::sigmoid(z);
    return g * s * (1 + z * (1 - s));
  }
  return g;  // "none" (other names never get this far: the forward rejected them)
}

// g * act'(z) with z = x W^T + b recomputed by the op (nothing extra kept between forward and
// backward), in float32 for half types (float64 for float64), returned in x's dtype.
at::Tensor through_activation(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w,
                              const at::Tensor& b, const std::string& activation) {
  if (activation == "none") return g;
  const auto compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor z = linear_op().call(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt, "none");
  return activation_backward(g.to(compute), z.to(compute), activation).to(x.scalar_type());
}

// The backward node of y = act(x W^T + b), x (..., K), W (N, K), b (N,):
//   dz = dy * act'(z);  dx = dz W;  dW = dz^T x (over all leading dimensions);  db = sum of dz.
// The GEMMs run through cutlass_gemm on transposed views. Same structure as CutlassGemmBackward.
struct LinearBackward : public torch::autograd::TraceableFunction {
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    torch::autograd::variable_list result(3);
    if (!grads[0].defined()) return result;
    const at::Tensor x = input_.unpack(), w = weight_.unpack(), b = bias_.unpack();
    const at::Tensor dz = through_activation(grads[0], x, w, b, activation_);
    // Symbolic sizes: AOTAutograd traces this with dynamic shapes.
    const at::Tensor dz2d = dz.reshape_symint({-1, w.sym_size(0)});
    if (task_should_compute_output(0)) {
      result[0] = cutlass_gemm_op().call(dz2d, w).reshape_symint(x.sym_sizes());
    }
    if (task_should_compute_output(1)) {
      result[1] = cutlass_gemm_op().call(dz2d.t(), x.reshape_symint({-1, x.sym_size(-1)}));
    }
    if (has_bias_ && task_should_compute_output(2)) result[2] = dz2d.sum(0);
    return result;
  }

  std::string name() const override { return "LinearBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    input_.reset_data();
    weight_.reset_data();
    bias_.reset_data();
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.collect(input_, false);
    args.collect(weight_, false);
    args.collect(bias_, false);
    args.collect(activation_);
    args.collect(has_bias_);
  }

  torch::autograd::variable_list apply_with_saved(
      const torch::autograd::variable_list& grads,
      torch::dynamo::autograd::SwapSavedVariables& saved) override {
    saved.before(input_);
    saved.before(weight_);
    saved.before(bias_);
    torch::autograd::variable_list result = apply(torch::autograd::variable_list(grads));
    saved.after(input_);
    saved.after(weight_);
    saved.after(bias_);
    return result;
  }

  torch::autograd::SavedVariable input_, weight_, bias_;  // bias_: only to recompute z
  std::string activation_;
  bool has_bias_ = false;
};

at::Tensor linear_autograd(const at::Tensor& input, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, c10::string_view activation) {
  TORCH_CHECK(input.defined() && weight.defined(), "linear: input and weight must be defined tensors");
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  c10::intrusive_ptr<LinearBackward> grad_fn;
  if (torch::autograd::compute_requires_grad(input, weight, b)) {
    grad_fn = c10::make_intrusive<LinearBackward>();
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(input, weight, b));
    grad_fn->activation_ = std::string(activation);
    grad_fn->has_bias_ = b.defined();
    grad_fn->input_ = torch::autograd::SavedVariable(input, false);
    grad_fn->weight_ = torch::autograd::SavedVariable(weight, false);
    if (b.defined() && activation != "none") grad_fn->bias_ = torch::autograd::SavedVariable(b, false);
  }
  at::Tensor y;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    y = linear_op().call(input, weight, bias, activation);  // validates activation, shapes, dtypes
  }
  if (grad_fn) torch::autograd::set_history(y, grad_fn);
  // Forward-mode AD: dy = act'(z) * (dx W^T + x dW^T + db).
  const at::Tensor dx = input._fw_grad(0), dw = weight._fw_grad(0);
  const at::Tensor db = b.defined() ? b._fw_grad(0) : at::Tensor();
  if (dx.defined() || dw.defined() || db.defined()) {
    const at::Tensor xp = input._fw_primal(0), wp = weight._fw_primal(0);
    const at::Tensor bp = b.defined() ? b._fw_primal(0) : at::Tensor();
    at::Tensor dz;
    auto add = [&](const at::Tensor& term) { dz = dz.defined() ? dz + term : term; };
    if (dx.defined()) add(linear_op().call(dx, wp, c10::nullopt, "none"));
    if (dw.defined()) add(linear_op().call(xp, dw, c10::nullopt, "none"));
    if (db.defined()) add(dz.defined() ? db : db.expand_symint(y.sym_sizes()).clone());
    y._set_fw_grad(through_activation(dz, xp, wp, bp, std::string(activation)), 0, false);
  }
  return y;
}

// ---- rms_norm: y = x r w, r = (mean(x^2, -1) + eps)^-1/2 (Zhang & Sennrich, 2019) -------------------
//   reverse: dx = r (g w - x_hat mean(g w x_hat, -1)), dw = sum over rows of g x_hat, x_hat = x r;
//   forward: dy = r w (dx - x_hat mean(x_hat dx, -1)) + x_hat dw.
// Computed in float32 for half types (float64 for float64), from ATen ops (differentiable again).

using RmsNormOp = at::Tensor(const at::Tensor&, const at::Tensor&, double);

const c10::TypedOperatorHandle<RmsNormOp>& rms_norm_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("ops::rms_norm", "").typed<RmsNormOp>();
  return op;
}

at::ScalarType compute_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// x_hat = x r, and r, in the compute type.
std::pair<at::Tensor, at::Tensor> rms_normalize(const at::Tensor& x, double eps) {
  const at::Tensor r = at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + eps);
  return {x * r, r};
}

struct RmsNormBackward : public torch::autograd::TraceableFunction {
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    torch::autograd::variable_list result(2);
    if (!grads[0].defined()) return result;
    const at::Tensor input = input_.unpack(), weight = weight_.unpack();
    const auto compute = compute_type(input);
    const at::Tensor x = input.to(compute), w = weight.to(compute), g = grads[0].to(compute);
    const auto [x_hat, r] = rms_normalize(x, eps_);
    if (task_should_compute_output(0)) {
      const at::Tensor gw = g * w;
      result[0] = (r * (gw - x_hat * (gw * x_hat).mean(-1, true))).to(input.scalar_type());
    }
    if (task_should_compute_output(1)) {
      result[1] = (g * x_hat).reshape_symint({-1, x.sym_size(-1)}).sum(0).to(weight.scalar_type());
    }
    return result;
  }

  std::string name() const override { return "RmsNormBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    input_.reset_data();
    weight_.reset_data();
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.collect(input_, false);
    args.collect(weight_, false);
    args.collect(eps_);
  }

  torch::autograd::variable_list apply_with_saved(
      const torch::autograd::variable_list& grads,
      torch::dynamo::autograd::SwapSavedVariables& saved) override {
    saved.before(input_);
    saved.before(weight_);
    saved.before(eps_);
    torch::autograd::variable_list result = apply(torch::autograd::variable_list(grads));
    saved.after(input_);
    saved.after(weight_);
    saved.after(eps_);
    return result;
  }

  torch::autograd::SavedVariable input_, weight_;
  double eps_ = 0;
};

at::Tensor rms_norm_autograd(const at::Tensor& input, const at::Tensor& weight, double eps) {
  TORCH_CHECK(input.defined() && weight.defined(), "rms_norm: input and weight must be defined tensors");
  c10::intrusive_ptr<RmsNormBackward> grad_fn;
  if (torch::autograd::compute_requires_grad(input, weight)) {
    grad_fn = c10::make_intrusive<RmsNormBackward>();
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(input, weight));
    grad_fn->input_ = torch::autograd::SavedVariable(input, false);
    grad_fn->weight_ = torch::autograd::SavedVariable(weight, false);
    grad_fn->eps_ = eps;
  }
  at::Tensor y;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    y = rms_norm_op().call(input, weight, eps);
  }
  if (grad_fn) torch::autograd::set_history(y, grad_fn);
  const at::Tensor dx = input._fw_grad(0), dw = weight._fw_grad(0);
  if (dx.defined() || dw.defined()) {
    const auto compute = compute_type(input);
    const at::Tensor x = input._fw_primal(0).to(compute), w = weight._fw_primal(0).to(compute);
    const auto [x_hat, r] = rms_normalize(x, eps);
    at::Tensor dy;
    if (dx.defined()) {
      const at::Tensor d = dx.to(compute);
      dy = r * w * (d - x_hat * (x_hat * d).mean(-1, true));
    }
    if (dw.defined()) {
      const at::Tensor term = x_hat * dw.to(compute);
      dy = dy.defined() ? dy + term : term;
    }
    y._set_fw_grad(dy.to(input.scalar_type()), 0, false);
  }
  return y;
}

// ---- silu_and_mul: y = silu(a) * b with (a, b) the two halves of x's last dimension -------------
//   reverse: da = g b s (1 + a (1 - s)) with s = sigmoid(a), db = g silu(a);
//   forward: dy = da b s (1 + a (1 - s)) + db silu(a) for a tangent (da, db).
// In float32 for half types (float64 for float64).

at::Tensor silu_and_mul_backward_math(const at::Tensor& input, const at::Tensor& g_or_tangent,
                                      bool forward_mode) {
  const auto compute = compute_type(input);
  const auto halves = input.to(compute).chunk(2, -1);
  const at::Tensor& a = halves[0];
  const at::Tensor& b = halves[1];
  const at::Tensor s = at::sigmoid(a);
  const at::Tensor dsilu = s * (1 + a * (1 - s));  // silu'(a)
  if (!forward_mode) {  // reverse: g -> (da, db) concatenated like the input
    const at::Tensor g = g_or_tangent.to(compute);
    return at::cat({g * b * dsilu, g * a * s}, -1).to(input.scalar_type());
  }
  // forward: tangent (dx = (da, db)) -> dy = da b silu'(a) + db silu(a)
  const auto t = g_or_tangent.to(compute).chunk(2, -1);
  return (t[0] * b * dsilu + t[1] * a * s).to(input.scalar_type());
}

struct SiluAndMulBackward : public torch::autograd::TraceableFunction {
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    torch::autograd::variable_list result(1);
    if (!grads[0].defined() || !task_should_compute_output(0)) return result;
    result[0] = silu_and_mul_backward_math(input_.unpack(), grads[0], /*forward_mode=*/false);
    return result;
  }

  std::string name() const override { return "SiluAndMulBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    input_.reset_data();
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.collect(input_, false);
  }

  torch::autograd::variable_list apply_with_saved(
      const torch::autograd::variable_list& grads,
      torch::dynamo::autograd::SwapSavedVariables& saved) override {
    saved.before(input_);
    torch::autograd::variable_list result = apply(torch::autograd::variable_list(grads));
    saved.after(input_);
    return result;
  }

  torch::autograd::SavedVariable input_;
};

at::Tensor silu_and_mul_autograd(const at::Tensor& input) {
  TORCH_CHECK(input.defined(), "silu_and_mul: input must be a defined tensor");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::silu_and_mul", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  c10::intrusive_ptr<SiluAndMulBackward> grad_fn;
  if (torch::autograd::compute_requires_grad(input)) {
    grad_fn = c10::make_intrusive<SiluAndMulBackward>();
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(input));
    grad_fn->input_ = torch::autograd::SavedVariable(input, false);
  }
  at::Tensor y;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    y = op.call(input);
  }
  if (grad_fn) torch::autograd::set_history(y, grad_fn);
  const at::Tensor dx = input._fw_grad(0);
  if (dx.defined()) {
    y._set_fw_grad(silu_and_mul_backward_math(input._fw_primal(0), dx, /*forward_mode=*/true), 0, false);
  }
  return y;
}

void fused_add_rms_norm_autograd(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                                 double eps) {
  TORCH_CHECK(!(at::GradMode::is_enabled() &&
                (input.requires_grad() || residual.requires_grad() || weight.requires_grad())),
              "fused_add_rms_norm: an in-place inference op, it does not support automatic "
              "differentiation, but one of the arguments requires grad. Use ops.rms_norm(input + "
              "residual, weight) to differentiate, or run under torch.no_grad().");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::fused_add_rms_norm", "")
                             .typed<void(at::Tensor&, at::Tensor&, const at::Tensor&, double)>();
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.call(input, residual, weight, eps);
  }
  torch::autograd::impl::bump_version(input);
  torch::autograd::impl::bump_version(residual);
}

void cutlass_gemm_out_autograd(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  TORCH_CHECK(!(at::GradMode::is_enabled() &&
                (A.requires_grad() || B.requires_grad() || out.requires_grad())),
              "cutlass_gemm: the out= variant does not support automatic differentiation, but one of "
              "the arguments requires grad. Call ops.cutlass_gemm(A, B) without out= to differentiate, "
              "or run under torch.no_grad().");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::cutlass_gemm", "out")
                             .typed<void(const at::Tensor&, const at::Tensor&, at::Tensor&)>();
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.call(A, B, out);
  }
  torch::autograd::impl::bump_version(out);  // out was written in place (as ATen out= ops do)
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, Autograd, m) {
  m.impl("cutlass_gemm", &ops::cutlass_gemm_autograd);
  m.impl("linear", &ops::linear_autograd);
  m.impl("rms_norm", &ops::rms_norm_autograd);
  m.impl("silu_and_mul", &ops::silu_and_mul_autograd);
  m.impl("cutlass_gemm.out", &ops::cutlass_gemm_out_autograd);
  m.impl("fused_add_rms_norm", &ops::fused_add_rms_norm_autograd);
}
