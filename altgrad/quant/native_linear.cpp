// The torch side of the native CPU road: a quantizer's call (``Plan``) and a quantized Linear's training call as one
// C++ autograd node (``linear``), with no Python between autograd and the kernel. The kernel itself is not compiled
// here: a Plan calls native_kernel.cpp's ``altgrad_quant_call`` through the address native.py passes in (the library
// ctypes loaded), so both roads run one binary and give the same bits. What the node adds is what F.linear's autograd
// does, call for call: at::linear forward; in the backward the gradient quantized first, then torch's
// mm_mat1_backward / mm_mat2_backward for the folded matmul and the engine's sum_to for a bias (linear_node.py is the
// Python twin; tests/layers/test_linear_node.py compares both with the module road bit for bit). Built by
// torch.utils.cpp_extension once per machine (native.linear_ext).
// Only the headers it uses (not torch/extension.h, which includes all of libtorch's C++ API): a third less compile
// time for the one-time build.
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randint.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <optional>

namespace altgrad {  // named: autograd shows the node as CppNode<altgrad::QuantLinearFn>

// native_kernel.cpp's entry point (see its comment for the arguments)
using QuantCall = int (*)(const float*, float*, int64_t, const int32_t*, int, int, int32_t, int, int, const float*,
                          float*, float*, int64_t, int, int, float*, int, const float*);

constexpr int kStochastic = 1;  // kernel_abi.ROUNDINGS.index("stochastic"); checked by native.py at load

float* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// One quantizer's native call with every argument but the input resolved (native.CallPlan's twin): the format's
// kernel parameters and scale constants, the scaler's state buffers and the statistics buffer (undefined: none).
struct Plan : torch::CustomClassHolder {
  QuantCall call;
  at::Tensor params, consts, scale, history, stats;
  int rounding, flags, kind, pow2, reduce_max;

  Plan(int64_t address, at::Tensor params_, int rounding_, int flags_, int kind_, bool pow2_, at::Tensor consts_,
       std::optional<at::Tensor> scale_, std::optional<at::Tensor> history_, bool reduce_max_,
       std::optional<at::Tensor> stats_)
      : call(reinterpret_cast<QuantCall>(address)), params(std::move(params_)), consts(std::move(consts_)),
        scale(scale_.value_or(at::Tensor())), history(history_.value_or(at::Tensor())),
        stats(stats_.value_or(at::Tensor())), rounding(rounding_), flags(flags_), kind(kind_), pow2(pow2_ ? 1 : 0),
        reduce_max(reduce_max_ ? 1 : 0) {
    TORCH_CHECK(params.scalar_type() == at::kInt && params.is_contiguous(), "altgrad: kernel parameters: int32");
    TORCH_CHECK(consts.scalar_type() == at::kFloat && consts.is_contiguous(), "altgrad: scale constants: float32");
  }

  bool stochastic() const { return rounding == kStochastic; }

  // y = q(x·s)/s as a new contiguous float32 tensor of x's shape (x: float32 on the CPU; copied when not contiguous),
  // or written into ``out`` (contiguous float32, x's element count; x itself may be it: each element is read before
  // it is written), counted in out's version counter as an in-place op is
  at::Tensor run(const at::Tensor& x, int32_t seed, bool update, const at::Tensor& out = at::Tensor()) const {
    const at::Tensor xc = x.contiguous();
    at::Tensor y = out.defined() ? out : at::empty(x.sizes(), at::TensorOptions().dtype(at::kFloat));
    if (out.defined()) {
      TORCH_CHECK(out.is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() == xc.numel(),
                  "altgrad.quant: a native call's out must be a contiguous float32 CPU tensor of ", xc.numel(),
                  " elements");
    }
    const int rc = call(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), params.data_ptr<int32_t>(), rounding,
                        flags, seed, kind, pow2, consts.data_ptr<float>(), ptr(scale), ptr(history),
                        history.defined() ? history.numel() : 0, reduce_max, update ? 1 : 0, ptr(stats),
                        at::get_num_threads(), nullptr);
    TORCH_CHECK(rc == 0, "altgrad.quant: the native kernel refused the call (code ", rc, ")");
    if (out.defined()) out.unsafeGetTensorImpl()->bump_version();
    return y;
  }
};

// rounding.draw_seed on the CPU's default generator: torch.randint(0, 2**31 - 1, (), dtype=torch.int32)
int32_t draw_seed() {
  return at::randint(0, 2147483647, {}, at::TensorOptions().dtype(at::kInt)).item<int32_t>();
}

using Ref = c10::intrusive_ptr<Plan>;

// y = linear(q_in(x), q_w(W), b); backward: g' = q_grad(g), dx = g'·q_w(W), dW = g'ᵀ·q_in(x), db = Σ g'.
// Seeds are drawn as the module road draws them: input, weight, then (when a gradient flows) the gradient's.
struct QuantLinearFn : torch::autograd::Function<QuantLinearFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& bias, const Ref& in, bool in_update, const Ref& wq,
                            bool w_update, const Ref& gq) {
    const bool need_x = x.requires_grad(), need_w = w.requires_grad();
    const bool need_b = bias.has_value() && bias->defined() && bias->requires_grad();
    at::Tensor xq = x, w_used = w;
    if (in) xq = in->run(x, in->stochastic() ? draw_seed() : 0, in_update);
    if (wq) w_used = wq->run(w, wq->stochastic() ? draw_seed() : 0, w_update);
    at::Tensor y = at::linear(xq, w_used, bias);
    const bool flows = need_x || need_w || need_b;
    if (gq && flows) {
      ctx->saved_data["g"] = c10::IValue::make_capsule(gq);
      ctx->saved_data["seed"] = static_cast<int64_t>(gq->stochastic() ? draw_seed() : 0);
    }
    ctx->saved_data["bias"] = bias.has_value() && bias->defined();  // an input of the node (needs_input_grad(2))
    ctx->saved_data["x_numel"] = x.numel();
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    // the formulas below assume the strides F.linear saw: contiguous operands (checked by the caller for x and W;
    // a quantized operand is a fresh contiguous tensor)
    TORCH_CHECK(xq.is_contiguous() && w_used.is_contiguous(), "altgrad: the Linear node needs contiguous operands");
    ctx->save_for_backward({need_w ? xq : at::Tensor(), need_x ? w_used : at::Tensor()});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& xq = saved[0];
    const at::Tensor& w = saved[1];
    at::Tensor g = grads[0];
    const auto found = ctx->saved_data.find("g");
    if (found != ctx->saved_data.end()) {
      const Ref gq = c10::static_intrusive_pointer_cast<Plan>(found->second.toCapsule());
      g = gq->run(g, static_cast<int32_t>(ctx->saved_data["seed"].toInt()), true);
    }
    at::Tensor g2 = g.dim() == 2 ? g : g.reshape({-1, g.size(-1)});  // F.linear folds to 2-D (a view here)
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      // mm_mat1_backward(g, mat2 = Wᵀ, mat1 = the folded input): a column-major input (only a 1 × 1 one is, among
      // contiguous inputs) gets (W·gᵀ)ᵀ
      const bool column_major = ctx->saved_data["x_numel"].toInt() == 1;
      dx = (column_major ? w.t().mm(g2.t()).t() : g2.mm(w)).reshape(ctx->saved_data["x_sizes"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) {
      // mm_mat2_backward(g, mat1, mat2 = Wᵀ): Wᵀ of a contiguous W is column-major, so (gᵀ·x)ᵀ, and Wᵀ's transpose
      // node turns it back: gᵀ·x
      dw = g2.t().mm(xq.reshape({-1, xq.size(-1)}));
    }
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) {
      db = g2.sum({0}, true).view({-1});  // the engine's sum_to(addmm's self gradient, the bias's shape)
    }
    return {dx, dw, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A plain float32 CPU tensor: strided, with storage of its own, no functorch wrapper or Python subclass dispatch, no
// forward-mode tangent (the module road takes anything else).
bool plain(const at::Tensor& t) {
  static const c10::DispatchKeySet wrapped({c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
                                            c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                            c10::DispatchKey::Conjugate, c10::DispatchKey::Negative});
  return t.defined() && t.is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided && t.has_storage()
         && !t.key_set().has_any(wrapped) && !t._fw_grad(0).defined();
}

constexpr int64_t kMaxNumel = int64_t{1} << 31;  // native.MAX_NUMEL: the stochastic hash counts elements in int32

// The node's output, or None where it cannot serve (grad mode off, CPU autocast on, an operand that is not a plain
// float32 CPU tensor, a non-contiguous input or weight, a tensor too large for the kernel): the caller then takes the
// module road. Shapes that do not fit raise as F.linear does.
std::optional<at::Tensor> linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                                 const std::optional<Ref>& in, bool in_update, const std::optional<Ref>& wq,
                                 bool w_update, const std::optional<Ref>& gq) {
  if (!at::GradMode::is_enabled() || at::autocast::is_autocast_enabled(at::kCPU)) return std::nullopt;
  if (!plain(x) || x.dim() < 2 || !x.is_contiguous() || !plain(w) || w.dim() != 2 || !w.is_contiguous()) {
    return std::nullopt;
  }
  if (bias.has_value() && bias->defined() && (!plain(*bias) || bias->dim() != 1)) return std::nullopt;
  const int64_t cols = x.size(-1) > 0 ? x.size(-1) : 1;
  if (x.numel() >= kMaxNumel || x.numel() / cols * w.size(0) >= kMaxNumel) return std::nullopt;
  return QuantLinearFn::apply(x, w, bias, in.value_or(Ref()), in_update, wq.value_or(Ref()), w_update,
                              gq.value_or(Ref()));
}

}  // namespace altgrad

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "altgrad.quant's native Linear node and quantizer call (native_linear.cpp)";
  m.attr("STOCHASTIC") = altgrad::kStochastic;
  using altgrad::Plan, altgrad::Ref;
  pybind11::class_<Plan, Ref>(m, "Plan")
      .def(pybind11::init<int64_t, at::Tensor, int, int, int, bool, at::Tensor, std::optional<at::Tensor>,
                          std::optional<at::Tensor>, bool, std::optional<at::Tensor>>())
      .def(
          "__call__",
          [](const Plan& p, const at::Tensor& x, std::optional<int64_t> seed, bool update,
             std::optional<at::Tensor> out) -> std::optional<at::Tensor> {
            if (!x.has_storage()) return std::nullopt;  // a functorch wrapper: the caller takes another road
            return p.run(x.detach(), static_cast<int32_t>(seed.value_or(0)), update, out.value_or(at::Tensor()));
          },
          pybind11::arg("x"), pybind11::arg("seed"), pybind11::arg("update"), pybind11::arg("out") = pybind11::none(),
          pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("set_stats", [](Plan& p, std::optional<at::Tensor> stats) { p.stats = stats.value_or(at::Tensor()); })
      .def_property_readonly("stochastic", &Plan::stochastic);
  m.def("linear", &altgrad::linear, "One quantized Linear call as one autograd node (None: it cannot serve)",
        pybind11::arg("x"),
        pybind11::arg("w"), pybind11::arg("bias"), pybind11::arg("in_plan"), pybind11::arg("in_update"),
        pybind11::arg("w_plan"), pybind11::arg("w_update"), pybind11::arg("g_plan"),
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
