// Test-only glue (not part of the patch series): exposes the series' C++ to Python so that
// tests/upstream/test_upstream.py can check it numerically against the installed torch, without building PyTorch.
//
//   torch.ops.upstream_attn.tanh_attention   -> at::native::_tanh_attention  (aten/src/ATen/native/TanhAttention.cpp)
//   <module>.backward / <module>.jvp         -> tanh_attention_backward / tanh_attention_jvp (FunctionsManual.cpp)
#include <ATen/ops/_tanh_attention_native.h>
#include <torch/csrc/autograd/FunctionsManual.h>
#include <torch/extension.h>

namespace details = torch::autograd::generated::details;
using OptTensor = std::optional<at::Tensor>;

namespace {
at::Tensor or_undefined(const OptTensor& t) {
  return t.has_value() ? *t : at::Tensor();
}
} // namespace

TORCH_LIBRARY(upstream_attn, m) {
  m.def("tanh_attention(Tensor q, Tensor k, Tensor v) -> (Tensor o, Tensor a)");
}

// The schema of the in-tree op's CompositeExplicitAutograd kernel: one kernel for every backend (Meta too).
TORCH_LIBRARY_IMPL(upstream_attn, CompositeExplicitAutograd, m) {
  m.impl("tanh_attention", TORCH_FN(at::native::_tanh_attention));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // As the generated TanhAttentionBackward0 calls it: undefined grads for unused outputs, and q/k/v passed
  // only when a requested gradient reads them (wrap_opt_if).
  m.def("backward", [](const OptTensor& grad_o, const OptTensor& grad_a, const OptTensor& q,
                       const OptTensor& k, const OptTensor& v, const at::Tensor& a,
                       std::array<bool, 3> grad_input_mask) {
    return details::tanh_attention_backward(or_undefined(grad_o), or_undefined(grad_a), q, k, v, a,
                                            grad_input_mask);
  });
  // As the generated VariableType kernel calls it: primals, the output a, and tangents (None = undefined;
  // the kernel itself passes _efficientzerotensor for an input without a tangent).
  m.def("jvp", [](const at::Tensor& q_p, const at::Tensor& k_p, const at::Tensor& v_p, const at::Tensor& a,
                  const OptTensor& q_t, const OptTensor& k_t, const OptTensor& v_t) {
    return details::tanh_attention_jvp(q_p, k_p, v_p, a, or_undefined(q_t), or_undefined(k_t),
                                       or_undefined(v_t));
  });
}
