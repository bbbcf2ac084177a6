// Test-only translation unit: compiles the lines the series adds to FunctionsManual.cpp in the same
// context as FunctionsManual.cpp (its namespace, its using-declarations, the headers it includes).
#include <torch/csrc/autograd/FunctionsManual.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <ATen/ATen.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <ATen/core/grad_mode.h>

namespace torch::autograd::generated::details {

using at::areAnyTensorSubclassLike;
using at::Tensor;

#include "FunctionsManual_added.inc"

} // namespace torch::autograd::generated::details
