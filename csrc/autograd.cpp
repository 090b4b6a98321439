// Autograd kernels registered in C++.
//
// Every differentiable op (cutlass_gemm, linear, rms_norm, silu_and_mul, grouped_gemm) has its formulas here rather
// than in Python (torch.library.register_autograd), for two reasons: a Python autograd kernel costs a
// round trip through the interpreter on every call, with or without grad (~4-5 us, more than a
// 64x64x64 GEMM on a CPU), and C++ programs that load the library (tests/cpp) get differentiable ops
// too. Each is an ATen-style graph node (BackwardNode below) with a forward-mode formula as well;
// tests/test_func_transforms.py checks every autograd mode against torch's own ops.
//
// The ops that write an argument (the out= variants, fused_add_rms_norm, fused_add_rms_norm_fp8) are not
// differentiable. Like torch.mm(..., out=), with grad mode on and an argument that requires grad they
// raise, instead of silently producing a result with no history. Their ADInplaceOrView kernel (ops::define, as
// ATen's in-place ops) bumps the written tensors' versions, also under inference mode, which skips the
// Autograd kernels but not this one for tensors made outside it.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/dynamo/compiled_autograd.h>
#include <torch/library.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <type_traits>

#include "activation_ops.h"
#include "checks.h"

namespace ops {
namespace {

const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&)>& cutlass_gemm_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::cutlass_gemm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op;
}

// ---- The graph-node machinery shared by every op ---------------------------------------------------
//
// Each backward node is written the way ATen's generated ones are (a Node holding SavedVariables,
// attached to the output with set_history), not as a torch::autograd::Function: that is what
// torch.func transforms support. A node's math is one static function of (incoming gradients, saved
// tensors, scalar attributes, which inputs need a gradient) so that it serves both the eager engine
// (apply) and compiled autograd (apply_with_saved: the function is handed to Python, which traces it
// into its graph; the protocol of torch/csrc/dynamo/compiled_autograd.h, as CppNode uses it).

// Newer torch owns autograd nodes by c10::intrusive_ptr (torch 2.11 and older: std::shared_ptr):
// support both, since the GPU machine runs torch 2.11 and CI a newer one.
constexpr bool kIntrusiveNodes = std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>;
template <typename T>
using NodePtr = std::conditional_t<kIntrusiveNodes, c10::intrusive_ptr<T>, std::shared_ptr<T>>;

template <typename T>
NodePtr<T> make_node() {
  if constexpr (kIntrusiveNodes) {
    return c10::make_intrusive<T>();
  } else {
    // torch::autograd::deleteNode (found by argument-dependent lookup: it exists only in the torch
    // versions that take this branch) frees long chains of nodes without deep recursion.
    return NodePtr<T>(new T(), [](T* node) { deleteNode(node); });
  }
}

using torch::autograd::variable_list;

// Derived provides: static constexpr const char* kName; static constexpr size_t kNumSaved;
// static variable_list math(const variable_list& grads, const std::vector<at::Tensor>& saved,
//                           const std::vector<c10::IValue>& attributes, const std::vector<bool>& needs).
template <typename Derived>
struct BackwardNode : public torch::autograd::TraceableFunction {
  BackwardNode() : saved_(Derived::kNumSaved) {}

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<at::Tensor> saved;
    for (const torch::autograd::SavedVariable& sv : saved_) saved.push_back(sv.unpack());
    return Derived::math(grads, saved, attributes_, needs());
  }

  std::string name() const override { return Derived::kName; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (torch::autograd::SavedVariable& sv : saved_) sv.reset_data();
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.collect(std::string(Derived::kName));
    args.collect(saved_, /*is_output=*/false);
    for (const c10::IValue& attribute : attributes_) args.collect(attribute);
    args.collect(needs());
  }

  variable_list apply_with_saved(const variable_list& grads,
                                 torch::dynamo::autograd::SwapSavedVariables& saved) override {
    saved.before(saved_);
    // Pack: the defined saved tensors, which slots they fill, the attributes, the needed outputs.
    std::vector<at::Tensor> tensors;
    std::vector<bool> defined;
    for (const torch::autograd::SavedVariable& sv : saved_) {
      const at::Tensor t = sv.unpack();
      defined.push_back(t.defined());
      if (t.defined()) tensors.push_back(t);
    }
    torch::dynamo::autograd::PackedArgs packed;
    packed.pack(tensors);
    packed.pack(defined);
    for (const c10::IValue& attribute : attributes_) packed.pack(attribute);
    packed.pack(needs());
    const std::vector<c10::IValue> args = packed.vec();
    std::vector<at::TypePtr> schema;
    for (const c10::IValue& arg : args) {
      schema.emplace_back(arg.isTensor() ? at::TensorType::get() : arg.type());
    }
    const auto output_metadata = torch::dynamo::autograd::IValuePacker<
        std::vector<std::optional<torch::autograd::InputMetadata>>>::pack(
        torch::dynamo::autograd::get_input_metadata(next_edges()));
    const auto& py = torch::dynamo::autograd::getPyCompilerInterface();
    // As a "custom function" (like CppNode): compiled autograd then binds it under a fresh name on
    // every call (a built-in name may be bound only once per process).
    const std::string fn_name = py->bind_function(saved.get_py_compiler(), Derived::kName,
                                                  &BackwardNode::apply_functional, schema,
                                                  /*is_custom_function=*/true, /*is_traceable=*/true);
    variable_list result = py->call_function(saved.get_py_compiler(), "apply_functional", fn_name,
                                             grads, args, output_metadata);
    saved.after(saved_);
    return result;
  }

  // The functional form compiled autograd traces: unpacks what apply_with_saved packed.
  static variable_list apply_functional(const variable_list& grads, const std::vector<c10::IValue>& args) {
    torch::dynamo::autograd::PackedArgs packed(args);
    const auto tensors = packed.unpack<std::vector<at::Tensor>>();
    const auto defined = packed.unpack<std::vector<bool>>();
    std::vector<at::Tensor> saved;
    size_t next = 0;
    for (bool d : defined) saved.push_back(d ? tensors.at(next++) : at::Tensor());
    std::vector<c10::IValue> attributes;
    for (size_t i = 0; i < Derived::kNumAttributes; ++i) attributes.push_back(packed.unpack<c10::IValue>());
    const auto needs = packed.unpack<std::vector<bool>>();
    return Derived::math(grads, saved, attributes, needs);
  }

  std::vector<bool> needs() const {
    std::vector<bool> out;
    for (size_t i = 0; i < num_outputs(); ++i) out.push_back(task_should_compute_output(i));
    return out;
  }

  std::vector<torch::autograd::SavedVariable> saved_;  // Derived::kNumSaved slots, some undefined
  std::vector<c10::IValue> attributes_;                 // Derived::kNumAttributes scalars
};

// Creates the node for an op's inputs (or returns null when no gradient is needed) and attaches it
// to the output: the two halves of every autograd kernel below.
template <typename Node, typename... Inputs>
NodePtr<Node> make_backward(const Inputs&... inputs) {
  if (!torch::autograd::compute_requires_grad(inputs...)) return nullptr;
  NodePtr<Node> node = make_node<Node>();
  node->set_next_edges(torch::autograd::collect_next_edges(inputs...));
  return node;
}

template <typename Ptr>
void save(const Ptr& node, size_t slot, const at::Tensor& t) {
  if (t.defined()) node->saved_[slot] = torch::autograd::SavedVariable(t, /*is_output=*/false);
}

// Runs `op` below autograd and attaches `node` (if any) to its result.
template <typename Ptr, typename Op>
at::Tensor call_and_record(const Ptr& node, Op&& op) {
  at::Tensor out;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    out = op();
  }
  if (node) torch::autograd::set_history(out, node);
  return out;
}

at::ScalarType compute_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// ---- cutlass_gemm: C = A B;  dA = dC B^T, dB = A^T dC;  forward: dC = dA B + A dB ---------------------
// The GEMMs of the backward are the op itself, on transposed views (the CUDA kernels read them in
// place), through the dispatcher: differentiable again, so double backward works.

struct CutlassGemmBackward : BackwardNode<CutlassGemmBackward> {
  static constexpr const char* kName = "CutlassGemmBackward";
  static constexpr size_t kNumSaved = 2;       // A (saved when B needs a gradient), B (when A does)
  static constexpr size_t kNumAttributes = 0;

  static variable_list math(const variable_list& grads, const std::vector<at::Tensor>& saved,
                            const std::vector<c10::IValue>&, const std::vector<bool>& needs) {
    variable_list result(2);
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return result;
    if (needs[0]) result[0] = cutlass_gemm_op().call(grad, saved[1].t());
    if (needs[1]) result[1] = cutlass_gemm_op().call(saved[0].t(), grad);
    return result;
  }
};

at::Tensor cutlass_gemm_autograd(const at::Tensor& A, const at::Tensor& B) {
  // Only what autograd itself needs: the shape and dtype checks are the backend's and the fake
  // kernel's (reading sizes here would specialize symbolic shapes under torch.export / compile).
  check_gemm_defined("cutlass_gemm", A, B);
  const auto grad_fn = make_backward<CutlassGemmBackward>(A, B);
  if (grad_fn) {
    if (grad_fn->should_compute_output(1)) save(grad_fn, 0, A);
    if (grad_fn->should_compute_output(0)) save(grad_fn, 1, B);
  }
  at::Tensor C = call_and_record(grad_fn, [&] { return cutlass_gemm_op().call(A, B); });
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

// ---- linear: y = act(z), z = x W^T + b, x (..., K), W (N, K), b (N,) -----------------------------------
//   dz = dy act'(z);  dx = dz W;  dW = dz^T x (over all leading dimensions);  db = sum of dz;
//   forward: dy = act'(z) (dx W^T + x dW^T + db).

using LinearOp = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                             c10::string_view);

const c10::TypedOperatorHandle<LinearOp>& linear_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("ops::linear", "").typed<LinearOp>();
  return op;
}

// g * act'(z) with z = x W^T + b recomputed by the op (nothing extra kept between forward and
// backward), in float32 for half types (float64 for float64), returned in x's dtype. The saved x, W, b
// are what the forward's autograd kernel saw (cast already, under autocast): the recompute bypasses an
// autocast region around backward(), so z is the forward's.
at::Tensor through_activation(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w,
                              const at::Tensor& b, const std::string& activation) {
  const Activation act = parse_activation("linear", activation);
  if (act == Activation::None) return g;
  const auto compute = compute_type(x);
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor z = linear_op().call(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt, "none");
  return activation_backward(g.to(compute), z.to(compute), act).to(x.scalar_type());
}

struct LinearBackward : BackwardNode<LinearBackward> {
  static constexpr const char* kName = "LinearBackward";
  // x (saved when W needs a gradient), W (when x does); with an activation all three, b included, to
  // recompute z. Like F.linear: a frozen weight keeps no activation memory for its input.
  static constexpr size_t kNumSaved = 3;
  static constexpr size_t kNumAttributes = 2;   // activation (str), has_bias (bool)

  static variable_list math(const variable_list& grads, const std::vector<at::Tensor>& saved,
                            const std::vector<c10::IValue>& attributes, const std::vector<bool>& needs) {
    variable_list result(3);
    const at::Tensor& g = grads[0];  // (..., N), y's shape
    if (!g.defined()) return result;
    const at::Tensor &x = saved[0], &w = saved[1], &b = saved[2];
    const at::Tensor dz = through_activation(g, x, w, b, attributes[0].toStringRef());
    // Symbolic sizes (AOTAutograd and compiled autograd trace this with dynamic shapes), and explicit
    // row counts rather than -1, which cannot be inferred when K or N is 0.
    c10::SymInt rows = 1;
    for (int64_t i = 0; i + 1 < g.dim(); ++i) rows *= g.sym_size(i);
    const at::Tensor dz2d = dz.reshape_symint({rows, g.sym_size(-1)});
    if (needs[0]) {
      std::vector<c10::SymInt> x_sizes(g.sym_sizes().begin(), g.sym_sizes().end());
      x_sizes.back() = w.sym_size(1);
      result[0] = cutlass_gemm_op().call(dz2d, w).reshape_symint(x_sizes);
    }
    if (needs[1]) result[1] = cutlass_gemm_op().call(dz2d.t(), x.reshape_symint({rows, x.sym_size(-1)}));
    if (attributes[1].toBool() && needs[2]) result[2] = dz2d.sum(0);
    return result;
  }
};

at::Tensor linear_autograd(const at::Tensor& input, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias, c10::string_view activation) {
  TORCH_CHECK(input.defined(), "linear: input must be a defined tensor (..., in_features), got None");
  TORCH_CHECK(weight.defined(), "linear: weight must be a defined tensor (out_features, in_features), got None");
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  const std::string act(activation);
  const auto grad_fn = make_backward<LinearBackward>(input, weight, b);
  if (grad_fn) {
    const bool recompute_z = act != "none";
    if (recompute_z || weight.requires_grad()) save(grad_fn, 0, input);
    if (recompute_z || input.requires_grad()) save(grad_fn, 1, weight);
    if (recompute_z) save(grad_fn, 2, b);
    grad_fn->attributes_ = {c10::IValue(act), c10::IValue(b.defined())};
  }
  // The op validates the activation, shapes and dtypes.
  at::Tensor y = call_and_record(grad_fn, [&] { return linear_op().call(input, weight, bias, activation); });
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
    y._set_fw_grad(through_activation(dz, xp, wp, bp, act), 0, false);
  }
  return y;
}

// ---- rms_norm: y = x r w, r = (mean(x^2, -1) + eps)^-1/2 (Zhang & Sennrich, 2019) -------------------
//   reverse: dx = r (g w - x_hat mean(g w x_hat, -1)), dw = sum over rows of g x_hat, x_hat = x r;
//   forward: dy = r w (dx - x_hat mean(x_hat dx, -1)) + x_hat dw.
// Computed in float32 for half types (float64 for float64), from ATen ops (differentiable again); with
// round_before_weight too (the rounding of x_hat has derivative 1, as a cast's).
// _rms_norm_tensor_eps is the same op with eps a 0-d CPU tensor (graphs of torch.compile(dynamic=True)
// carry a float argument as one); its formulas add that tensor where rms_norm adds the number.

using RmsNormOp = at::Tensor(const at::Tensor&, const at::Tensor&, double, bool);

const c10::TypedOperatorHandle<RmsNormOp>& rms_norm_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("ops::rms_norm", "").typed<RmsNormOp>();
  return op;
}

// x_hat = x r, and r, in the compute type; eps a double or a 0-d tensor.
template <typename Eps>
std::pair<at::Tensor, at::Tensor> rms_normalize(const at::Tensor& x, const Eps& eps) {
  const at::Tensor r = at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + eps);
  return {x * r, r};
}

struct RmsNormBackward : BackwardNode<RmsNormBackward> {
  static constexpr const char* kName = "RmsNormBackward";
  static constexpr size_t kNumSaved = 3;        // input, weight, eps (a 0-d tensor, or undefined)
  static constexpr size_t kNumAttributes = 1;   // eps (float), where no eps tensor is saved

  static variable_list math(const variable_list& grads, const std::vector<at::Tensor>& saved,
                            const std::vector<c10::IValue>& attributes, const std::vector<bool>& needs) {
    variable_list result(2);
    if (!grads[0].defined()) return result;
    const at::Tensor &input = saved[0], &weight = saved[1];
    const auto compute = compute_type(input);
    const at::Tensor x = input.to(compute), w = weight.to(compute), g = grads[0].to(compute);
    const auto [x_hat, r] = saved[2].defined() ? rms_normalize(x, saved[2]) : rms_normalize(x, attributes[0].toDouble());
    if (needs[0]) {
      const at::Tensor gw = g * w;
      result[0] = (r * (gw - x_hat * (gw * x_hat).mean(-1, true))).to(input.scalar_type());
    }
    if (needs[1]) {
      // Sum over every leading dimension (none for a 1-D input: sum() over an empty list would reduce
      // everything). No reshape(-1, hidden): it cannot infer -1 when hidden is 0.
      const at::Tensor gx = g * x_hat;
      std::vector<int64_t> leading(static_cast<size_t>(x.dim() - 1));
      for (size_t i = 0; i < leading.size(); ++i) leading[i] = static_cast<int64_t>(i);
      result[1] = (leading.empty() ? gx : gx.sum(leading)).to(weight.scalar_type());
    }
    return result;
  }
};

template <typename Eps, typename Call>
at::Tensor rms_norm_autograd_impl(const char* op, const at::Tensor& input, const at::Tensor& weight, const Eps& eps,
                                  Call&& call) {
  TORCH_CHECK(input.defined(), op, ": input must be a defined tensor (..., hidden), got None");
  TORCH_CHECK(weight.defined(), op, ": weight must be a defined tensor (hidden,), got None");
  const auto grad_fn = make_backward<RmsNormBackward>(input, weight);
  if (grad_fn) {
    save(grad_fn, 0, input);
    save(grad_fn, 1, weight);
    if constexpr (std::is_same_v<Eps, at::Tensor>) {
      save(grad_fn, 2, eps);
      grad_fn->attributes_ = {c10::IValue(0.0)};
    } else {
      grad_fn->attributes_ = {c10::IValue(eps)};
    }
  }
  at::Tensor y = call_and_record(grad_fn, call);
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

at::Tensor rms_norm_autograd(const at::Tensor& input, const at::Tensor& weight, double eps, bool round_before_weight) {
  return rms_norm_autograd_impl("rms_norm", input, weight, eps,
                                [&] { return rms_norm_op().call(input, weight, eps, round_before_weight); });
}

// An argument of a non-differentiable op call, by the name its error gives.
struct NamedArg {
  const char* name;
  const at::Tensor& tensor;
};

// Refuses an argument whose derivative the result would silently lack, naming it: with grad mode on, one
// that requires grad (reverse mode); in any mode, one with a forward-mode tangent (forward AD ignores grad
// mode; ATen's out= ops raise NotImplementedError there too). `why`: what the op does not differentiate;
// `instead`: how to differentiate or do without (both modes).
void refuse_grad(const char* op, std::initializer_list<NamedArg> arguments, const char* why, const char* instead) {
  for (const NamedArg& a : arguments) {
    if (!a.tensor.defined()) continue;
    TORCH_CHECK(!(at::GradMode::is_enabled() && a.tensor.requires_grad()), op, ": ", why, ", but ", a.name,
                " requires grad. ", instead, ", or run under torch.no_grad().");
    TORCH_CHECK_NOT_IMPLEMENTED(!a.tensor._fw_grad(/*level=*/0).defined(), op, ": ", why, ", but ", a.name,
                                " has a forward-mode AD tangent (torch.func.jvp, torch.autograd.forward_ad), which "
                                "the result would silently lack. ",
                                instead, ".");
  }
}

// A call whose tensors are all None dispatches here (to no backend kernel below): name the first.
void require_defined(const char* op, std::initializer_list<NamedArg> required) {
  for (const NamedArg& a : required) {
    TORCH_CHECK(a.tensor.defined(), op, ": ", a.name, " must be a defined tensor, got None");
  }
}

void check_eps_tensor(const char* op, const at::Tensor& eps) {
  TORCH_CHECK(eps.defined() && eps.dim() == 0 && eps.device().is_cpu() && at::isFloatingType(eps.scalar_type()),
              op, ": expected eps to be a 0-d floating tensor on the CPU, got ",
              eps.defined() ? eps.toString() + " of shape " + c10::str(eps.sizes()) + " on " + eps.device().str()
                            : std::string("None"));
}

// Below autograd, on every backend: rms_norm with eps read on the host (a CPU tensor: no device sync).
at::Tensor rms_norm_tensor_eps(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& eps,
                               bool round_before_weight) {
  check_eps_tensor("_rms_norm_tensor_eps", eps);
  return rms_norm_op().call(input, weight, eps.item<double>(), round_before_weight);
}

at::Tensor rms_norm_tensor_eps_autograd(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& eps,
                                        bool round_before_weight) {
  check_eps_tensor("_rms_norm_tensor_eps", eps);
  refuse_grad("_rms_norm_tensor_eps", {{"eps", eps}}, "the op does not differentiate in eps",
              "Detach it, or compute the norm with ATen ops");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::_rms_norm_tensor_eps", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>();
  return rms_norm_autograd_impl("_rms_norm_tensor_eps", input, weight, eps.detach(),
                                [&] { return op.call(input, weight, eps, round_before_weight); });
}

// ---- silu_and_mul: y = silu(a) * b with (a, b) the two halves of x's last dimension -------------
//   reverse: da = g b s (1 + a (1 - s)) with s = sigmoid(a), db = g silu(a);
//   forward: dy = da b s (1 + a (1 - s)) + db silu(a) for a tangent (da, db).
// In float32 for half types (float64 for float64).

at::Tensor silu_and_mul_derivative(const at::Tensor& input, const at::Tensor& g_or_tangent,
                                   bool forward_mode) {
  const auto compute = compute_type(input);
  const auto halves = input.to(compute).chunk(2, -1);
  const at::Tensor& a = halves[0];
  const at::Tensor& b = halves[1];
  const at::Tensor s = at::sigmoid(a);
  const at::Tensor dsilu = s * (1 + a * (1 - s));  // silu'(a)
  if (!forward_mode) {  // reverse: g -> (da, db), concatenated like the input
    const at::Tensor g = g_or_tangent.to(compute);
    return at::cat({g * b * dsilu, g * a * s}, -1).to(input.scalar_type());
  }
  const auto t = g_or_tangent.to(compute).chunk(2, -1);
  return (t[0] * b * dsilu + t[1] * a * s).to(input.scalar_type());
}

struct SiluAndMulBackward : BackwardNode<SiluAndMulBackward> {
  static constexpr const char* kName = "SiluAndMulBackward";
  static constexpr size_t kNumSaved = 1;
  static constexpr size_t kNumAttributes = 0;

  static variable_list math(const variable_list& grads, const std::vector<at::Tensor>& saved,
                            const std::vector<c10::IValue>&, const std::vector<bool>& needs) {
    variable_list result(1);
    if (grads[0].defined() && needs[0]) {
      result[0] = silu_and_mul_derivative(saved[0], grads[0], /*forward_mode=*/false);
    }
    return result;
  }
};

at::Tensor silu_and_mul_autograd(const at::Tensor& input) {
  TORCH_CHECK(input.defined(), "silu_and_mul: input must be a defined tensor (..., 2 * d), got None");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::silu_and_mul", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  const auto grad_fn = make_backward<SiluAndMulBackward>(input);
  if (grad_fn) save(grad_fn, 0, input);
  at::Tensor y = call_and_record(grad_fn, [&] { return op.call(input); });
  const at::Tensor dx = input._fw_grad(0);
  if (dx.defined()) {
    y._set_fw_grad(silu_and_mul_derivative(input._fw_primal(0), dx, /*forward_mode=*/true), 0, false);
  }
  return y;
}

// The Autograd kernel of an in-place op that is not differentiable: an argument refuse_grad refuses is an
// error (a result without its derivative would be silently wrong); otherwise `call` runs the op below
// autograd, through its ADInplaceOrView kernel (layout_errors.cpp, bump_versions), which bumps the
// written tensors' versions.
template <typename Call>
void run_inference_inplace(const char* op, std::initializer_list<NamedArg> arguments, const char* why,
                           const char* instead, Call&& call) {
  refuse_grad(op, arguments, why, instead);
  const at::AutoDispatchBelowAutograd below_autograd;
  call();
}

void fused_add_rms_norm_autograd(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                                 double eps, bool round_before_weight) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::fused_add_rms_norm", "")
                             .typed<void(at::Tensor&, at::Tensor&, const at::Tensor&, double, bool)>();
  run_inference_inplace(
      "fused_add_rms_norm", {{"input", input}, {"residual", residual}, {"weight", weight}},
      "an in-place inference op, it does not support automatic differentiation",
      "Use ops.rms_norm(input + residual, weight) to differentiate",
      [&] { op.call(input, residual, weight, eps, round_before_weight); });
}

// _fused_add_rms_norm_tensor_eps: fused_add_rms_norm with eps a 0-d CPU tensor, as _rms_norm_tensor_eps.
using FusedAddRmsNormOp = void(at::Tensor&, at::Tensor&, const at::Tensor&, double, bool);

void fused_add_rms_norm_tensor_eps(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                                   const at::Tensor& eps, bool round_before_weight) {
  check_eps_tensor("_fused_add_rms_norm_tensor_eps", eps);
  check_fused_add_rms_norm_inputs(input, residual, weight, "_fused_add_rms_norm_tensor_eps");
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("ops::fused_add_rms_norm", "").typed<FusedAddRmsNormOp>();
  op.call(input, residual, weight, eps.item<double>(), round_before_weight);
}

void fused_add_rms_norm_tensor_eps_autograd(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                                            const at::Tensor& eps, bool round_before_weight) {
  check_eps_tensor("_fused_add_rms_norm_tensor_eps", eps);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::_fused_add_rms_norm_tensor_eps", "")
                             .typed<void(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>();
  run_inference_inplace(
      "_fused_add_rms_norm_tensor_eps",
      {{"input", input}, {"residual", residual}, {"weight", weight}, {"eps", eps}},
      "an in-place inference op, it does not support automatic differentiation",
      "Use ops.rms_norm(input + residual, weight) to differentiate",
      [&] { op.call(input, residual, weight, eps, round_before_weight); });
}

void cutlass_gemm_out_autograd(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::cutlass_gemm", "out")
                             .typed<void(const at::Tensor&, const at::Tensor&, at::Tensor&)>();
  run_inference_inplace("cutlass_gemm", {{"A", A}, {"B", B}, {"out", out}},
                        "the out= variant does not support automatic differentiation",
                        "Call ops.cutlass_gemm(A, B) without out= to differentiate", [&] { op.call(A, B, out); });
}

// ---- scaled_gemm: not differentiable (FP8 operands have no gradient), so it refuses grad mode ----
// inputs that require grad rather than return a result that silently has none.

constexpr const char* kScaledGemmNoGrad = "not differentiable (FP8 operands have no gradient)";
constexpr const char* kFp8NoGrad = "not differentiable (FP8 codes have no gradient)";
constexpr const char* kDetach = "Detach it (x.detach())";

at::Tensor scaled_gemm_autograd(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                                c10::optional<at::ScalarType> out_dtype, c10::string_view activation,
                                bool use_fast_accum) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::scaled_gemm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const c10::optional<at::Tensor>&,
                                               c10::optional<at::ScalarType>, c10::string_view, bool)>();
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  require_defined("scaled_gemm", {{"A", A}, {"B", B}, {"scale_a", scale_a}, {"scale_b", scale_b}});
  refuse_grad("scaled_gemm", {{"A", A}, {"B", B}, {"scale_a", scale_a}, {"scale_b", scale_b}, {"bias", b}},
              kScaledGemmNoGrad, kDetach);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum);
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_autograd(const at::Tensor& input, c10::string_view granularity,
                                                         c10::optional<at::ScalarType> dtype,
                                                         const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::quantize_fp8", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, c10::string_view,
                                                                       c10::optional<at::ScalarType>,
                                                                       const c10::optional<at::Tensor>&, bool)>();
  const at::Tensor s = scale.has_value() ? *scale : at::Tensor();
  require_defined("quantize_fp8", {{"input", input}});
  refuse_grad("quantize_fp8", {{"input", input}, {"scale", s}}, kFp8NoGrad, kDetach);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(input, granularity, dtype, scale, pow2_scale);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fp8_autograd(const at::Tensor& input, const at::Tensor& weight, double eps,
                                                         c10::string_view granularity,
                                                         c10::optional<at::ScalarType> dtype,
                                                         const c10::optional<at::Tensor>& scale, bool pow2_scale,
                                                         bool round_before_weight) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::rms_norm_fp8", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, double, c10::string_view,
                                 c10::optional<at::ScalarType>, const c10::optional<at::Tensor>&, bool, bool)>();
  const at::Tensor s = scale.has_value() ? *scale : at::Tensor();
  require_defined("rms_norm_fp8", {{"input", input}, {"weight", weight}});
  refuse_grad("rms_norm_fp8", {{"input", input}, {"weight", weight}, {"scale", s}}, kFp8NoGrad, kDetach);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(input, weight, eps, granularity, dtype, scale, pow2_scale, round_before_weight);
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_fp8_autograd(
    const at::Tensor& input, at::Tensor& residual, const at::Tensor& weight, double eps, c10::string_view granularity,
    c10::optional<at::ScalarType> dtype, const c10::optional<at::Tensor>& scale, bool pow2_scale,
    bool round_before_weight) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::fused_add_rms_norm_fp8", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(
                                 const at::Tensor&, at::Tensor&, const at::Tensor&, double, c10::string_view,
                                 c10::optional<at::ScalarType>, const c10::optional<at::Tensor>&, bool, bool)>();
  const at::Tensor s = scale.has_value() ? *scale : at::Tensor();
  require_defined("fused_add_rms_norm_fp8", {{"input", input}, {"residual", residual}, {"weight", weight}});
  std::tuple<at::Tensor, at::Tensor> result;
  run_inference_inplace(
      "fused_add_rms_norm_fp8", {{"input", input}, {"residual", residual}, {"weight", weight}, {"scale", s}},
      kFp8NoGrad, kDetach,
      [&] {
        result = op.call(input, residual, weight, eps, granularity, dtype, scale, pow2_scale, round_before_weight);
      });
  return result;
}

std::tuple<at::Tensor, at::Tensor> silu_and_mul_fp8_autograd(const at::Tensor& input, c10::string_view granularity,
                                                             c10::optional<at::ScalarType> dtype,
                                                             const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::silu_and_mul_fp8", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(
                                 const at::Tensor&, c10::string_view, c10::optional<at::ScalarType>,
                                 const c10::optional<at::Tensor>&, bool)>();
  const at::Tensor s = scale.has_value() ? *scale : at::Tensor();
  require_defined("silu_and_mul_fp8", {{"input", input}});
  refuse_grad("silu_and_mul_fp8", {{"input", input}, {"scale", s}}, kFp8NoGrad, kDetach);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(input, granularity, dtype, scale, pow2_scale);
}

void scaled_gemm_out_autograd(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                              const at::Tensor& scale_b, const c10::optional<at::Tensor>& bias,
                              c10::optional<at::ScalarType> out_dtype, c10::string_view activation,
                              bool use_fast_accum, at::Tensor& out) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::scaled_gemm", "out")
                             .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const c10::optional<at::Tensor>&, c10::optional<at::ScalarType>,
                                         c10::string_view, bool, at::Tensor&)>();
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  require_defined("scaled_gemm", {{"A", A}, {"B", B}, {"scale_a", scale_a}, {"scale_b", scale_b}, {"out", out}});
  run_inference_inplace(
      "scaled_gemm", {{"A", A}, {"B", B}, {"scale_a", scale_a}, {"scale_b", scale_b}, {"bias", b}, {"out", out}},
      kScaledGemmNoGrad, kDetach,
      [&] { op.call(A, B, scale_a, scale_b, bias, out_dtype, activation, use_fast_accum, out); });
}

at::Tensor scaled_grouped_gemm_autograd(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                        const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                        const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::scaled_grouped_gemm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const c10::optional<at::Tensor>&,
                                               const c10::optional<at::Tensor>&, c10::optional<at::ScalarType>)>();
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  require_defined("scaled_grouped_gemm", {{"A", A}, {"B", B}, {"scale_a", scale_a}, {"scale_b", scale_b}});
  refuse_grad("scaled_grouped_gemm", {{"A", A}, {"B", B}, {"scale_a", scale_a}, {"scale_b", scale_b}, {"bias", b}},
              kScaledGemmNoGrad, kDetach);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(A, B, scale_a, scale_b, offs, bias, out_dtype);
}

void scaled_grouped_gemm_out_autograd(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                      const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                      const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                                      at::Tensor& out) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::scaled_grouped_gemm", "out")
                             .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&,
                                         c10::optional<at::ScalarType>, at::Tensor&)>();
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  require_defined("scaled_grouped_gemm", {{"A", A}, {"B", B}, {"scale_a", scale_a}, {"scale_b", scale_b}, {"out", out}});
  run_inference_inplace(
      "scaled_grouped_gemm",
      {{"A", A}, {"B", B}, {"scale_a", scale_a}, {"scale_b", scale_b}, {"bias", b}, {"out", out}}, kScaledGemmNoGrad,
      kDetach, [&] { op.call(A, B, scale_a, scale_b, offs, bias, out_dtype, out); });
}

// ---- grouped_gemm: out = A B per group (checks.h GroupedMode), offs fixed -------------------------------
//   dA = grouped_gemm(dout, B^T, offs), dB = grouped_gemm(A^T, dout, offs) in every mode (the transposes
//   move each mode to another: 2D x 3D's dB is a 2D x 2D over M, 2D x 2D's dA a 3D x 2D, ...);
//   forward: dout = grouped_gemm(dA, B, offs) + grouped_gemm(A, dB, offs). With out_dtype float32 for
//   half inputs the gradients are in the inputs' dtype. For B stored transposed (experts' weights (G, N, K)
//   passed as B = W^T, as transformers holds them) dB comes in that layout, as torch._grouped_mm's backward
//   gives it: dB = grouped_gemm(dout^T, A, offs)^T (another mode again), so W's gradient is contiguous.

using GroupedGemmOp = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                                 c10::optional<at::ScalarType>);

const c10::TypedOperatorHandle<GroupedGemmOp>& grouped_gemm_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("ops::grouped_gemm", "").typed<GroupedGemmOp>();
  return op;
}

c10::optional<at::Tensor> optional_tensor(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

struct GroupedGemmBackward : BackwardNode<GroupedGemmBackward> {
  static constexpr const char* kName = "GroupedGemmBackward";
  static constexpr size_t kNumSaved = 3;       // A (when B needs a gradient), B (when A does), offs
  static constexpr size_t kNumAttributes = 2;  // the inputs' dtype (int), whether B is stored transposed

  static variable_list math(const variable_list& grads, const std::vector<at::Tensor>& saved,
                            const std::vector<c10::IValue>& attributes, const std::vector<bool>& needs) {
    variable_list result(2);
    if (!grads[0].defined()) return result;
    const at::Tensor g = grads[0].to(static_cast<at::ScalarType>(attributes[0].toInt()));
    const c10::optional<at::Tensor> offs = optional_tensor(saved[2]);
    const at::Tensor &A = saved[0], &B = saved[1];
    if (needs[0]) result[0] = grouped_gemm_op().call(g, B.transpose(-2, -1), offs, c10::nullopt);
    if (needs[1]) {
      result[1] = attributes[1].toBool()
                      ? grouped_gemm_op().call(g.transpose(-2, -1), A, offs, c10::nullopt).transpose(-2, -1)
                      : grouped_gemm_op().call(A.transpose(-2, -1), g, offs, c10::nullopt);
    }
    return result;
  }
};

// Whether B's last two dimensions are stored transposed (column-major matrices).
bool stored_transposed(const at::Tensor& B) {
  return B.sym_stride(-2) == 1 && B.sym_stride(-1) != 1;
}

at::Tensor grouped_gemm_autograd(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                 c10::optional<at::ScalarType> out_dtype) {
  check_gemm_defined("grouped_gemm", A, B);
  const at::Tensor o = offs.has_value() ? *offs : at::Tensor();
  const auto grad_fn = make_backward<GroupedGemmBackward>(A, B);
  if (grad_fn) {
    if (grad_fn->should_compute_output(1)) save(grad_fn, 0, A);
    if (grad_fn->should_compute_output(0)) save(grad_fn, 1, B);
    save(grad_fn, 2, o);
    grad_fn->attributes_ = {c10::IValue(static_cast<int64_t>(A.scalar_type())),
                            c10::IValue(B.dim() >= 2 && stored_transposed(B))};
  }
  at::Tensor out = call_and_record(grad_fn, [&] { return grouped_gemm_op().call(A, B, offs, out_dtype); });
  const at::Tensor dA = A._fw_grad(/*level=*/0), dB = B._fw_grad(/*level=*/0);
  if (dA.defined() || dB.defined()) {
    at::Tensor dout;
    if (dA.defined()) dout = grouped_gemm_op().call(dA, B._fw_primal(0), offs, out_dtype);
    if (dB.defined()) {
      const at::Tensor term = grouped_gemm_op().call(A._fw_primal(0), dB, offs, out_dtype);
      dout = dout.defined() ? dout + term : term;
    }
    out._set_fw_grad(dout, /*level=*/0, /*is_inplace_op=*/false);
  }
  return out;
}

void grouped_gemm_out_autograd(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                               c10::optional<at::ScalarType> out_dtype, at::Tensor& out) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::grouped_gemm", "out")
                             .typed<void(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                                         c10::optional<at::ScalarType>, at::Tensor&)>();
  run_inference_inplace("grouped_gemm", {{"A", A}, {"B", B}, {"out", out}},
                        "the out= variant does not support automatic differentiation",
                        "Call ops.grouped_gemm(A, B, offs) without out= to differentiate",
                        [&] { op.call(A, B, offs, out_dtype, out); });
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
  m.impl("_rms_norm_tensor_eps", &ops::rms_norm_tensor_eps_autograd);
  m.impl("_fused_add_rms_norm_tensor_eps", &ops::fused_add_rms_norm_tensor_eps_autograd);
  m.impl("scaled_gemm", &ops::scaled_gemm_autograd);
  m.impl("scaled_gemm.out", &ops::scaled_gemm_out_autograd);
  m.impl("quantize_fp8", &ops::quantize_fp8_autograd);
  m.impl("rms_norm_fp8", &ops::rms_norm_fp8_autograd);
  m.impl("fused_add_rms_norm_fp8", &ops::fused_add_rms_norm_fp8_autograd);
  m.impl("silu_and_mul_fp8", &ops::silu_and_mul_fp8_autograd);
  m.impl("grouped_gemm", &ops::grouped_gemm_autograd);
  m.impl("grouped_gemm.out", &ops::grouped_gemm_out_autograd);
  m.impl("scaled_grouped_gemm", &ops::scaled_grouped_gemm_autograd);
  m.impl("scaled_grouped_gemm.out", &ops::scaled_grouped_gemm_out_autograd);
}

TORCH_LIBRARY_IMPL(ops, CompositeExplicitAutograd, m) {
  m.impl("_rms_norm_tensor_eps", &ops::rms_norm_tensor_eps);
  m.impl("_fused_add_rms_norm_tensor_eps", &ops::fused_add_rms_norm_tensor_eps);
}
