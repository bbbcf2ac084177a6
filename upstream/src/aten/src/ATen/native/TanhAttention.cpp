// Tanh attention: the operator of the Autograd Onboarding Lab.
//
//   x = q kᵀ        (1)     q: (n, d)   k: (n, d)   x: (n, n)
//   a = tanh(x)     (2)
//   o = a v         (3)     v: (n, e)   o: (n, e)
//
// Returns (o, a). Equation numbers are those of the lab's derivation, whose
// gradients are (4)-(16).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <c10/util/irange.h>

#ifndef AT_PER_OPERATOR_HEADERS
#include <ATen/Functions.h>
#include <ATen/NativeFunctions.h>
#else
#include <ATen/ops/_tanh_attention_native.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/tanh.h>
#endif

namespace at::native {

namespace {

bool is_supported_dtype(ScalarType dtype) {
  return dtype == kHalf || dtype == kBFloat16 || dtype == kFloat ||
      dtype == kDouble || dtype == kComplexFloat || dtype == kComplexDouble;
}

// The lab's input contract, checked before any compute: q (n, d), k (n, d),
// v (n, e), all 2-D, one floating-point or complex dtype, one device, one n.
// Any of n, d, e may be 0. Shape and device errors are ValueErrors and dtype
// errors TypeErrors in Python (the lab's contract), naming the argument(s).
// Size equalities use expect_true, as TORCH_SYM_CHECK does: under dynamic
// shapes they become deferred runtime asserts, not guards.
void check_tanh_attention_inputs(
    const Tensor& q,
    const Tensor& k,
    const Tensor& v) {
  const std::array<const Tensor*, 3> args = {&q, &k, &v};
  const std::array<const char*, 3> names = {"q", "k", "v"};
  const std::array<const char*, 3> dims = {"n, d", "n, d", "n, e"};
  for (const auto i : c10::irange(args.size())) {
    const Tensor& t = *args[i];
    TORCH_CHECK_VALUE(
        t.dim() == 2,
        "_tanh_attention(): argument '", names[i], "' must be 2-D (", dims[i],
        "), got ", t.dim(), "-D with shape ", t.sym_sizes());
    TORCH_CHECK_TYPE(
        is_supported_dtype(t.scalar_type()),
        "_tanh_attention(): argument '", names[i],
        "' must have a floating-point or complex dtype (float16, bfloat16, "
        "float32, float64, complex64 or complex128), got ", t.scalar_type());
  }
  TORCH_CHECK_VALUE(
      q.sym_size(1).sym_eq(k.sym_size(1)).expect_true(__FILE__, __LINE__),
      "_tanh_attention(): q and k must have the same second dimension d, got q ",
      q.sym_sizes(), " and k ", k.sym_sizes());
  TORCH_CHECK_VALUE(
      q.sym_size(0).sym_eq(k.sym_size(0)).expect_true(__FILE__, __LINE__) &&
          q.sym_size(0).sym_eq(v.sym_size(0)).expect_true(__FILE__, __LINE__),
      "_tanh_attention(): q, k and v must have the same first dimension n ",
      "(q is (n, d), k is (n, d), v is (n, e)), got q ", q.sym_sizes(),
      ", k ", k.sym_sizes(), " and v ", v.sym_sizes());
  TORCH_CHECK_TYPE(
      q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
      "_tanh_attention(): q, k and v must have the same dtype, got q ",
      q.scalar_type(), ", k ", k.scalar_type(), " and v ", v.scalar_type());
  TORCH_CHECK_VALUE(
      q.device() == k.device() && q.device() == v.device(),
      "_tanh_attention(): q, k and v must be on the same device, got q ",
      q.device(), ", k ", k.device(), " and v ", v.device());
}

} // namespace

std::tuple<Tensor, Tensor> _tanh_attention(
    const Tensor& q,
    const Tensor& k,
    const Tensor& v) {
  check_tanh_attention_inputs(q, k, v);
  auto a = at::tanh(at::mm(q, k.mT())); // (1), (2)
  auto o = at::mm(a, v); // (3)
  return std::make_tuple(std::move(o), std::move(a));
}

} // namespace at::native
