// The decoding products of aiayn/nn/fp32_kernels.py and aiayn/nn/int8_kernel.py, in C++.
//
// A captured decoding step (aiayn/generate/captured.py) is C++ that inductor generated; it
// calls each product through PyTorch's dispatcher by name.  With only the Python
// implementations registered, every one of those calls -- some forty a step -- takes the
// interpreter's lock, boxes its arguments into Python objects and runs a Python function
// before it reaches oneDNN or fbgemm.  The kernels here are the same products reached from
// C++: the dispatcher finds them on the CPU key, ahead of the Python implementations (which
// stay registered, on CompositeExplicitAutograd, for a process that cannot build this file).
//
// A packed weight is named by an integer handle, as in the Python modules: the tables here
// hold each handle's weight weakly, as theirs do, so a decoding block's exit (fp32) or a freed
// layer (int8) frees the weight, and a call that names a freed weight fails with a message.
//
// Shapes: N rows, I in features, O out features.

#include <ATen/ATen.h>
#include <ATen/native/quantized/PackedParams.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace {

using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
using WeakInt8 = c10::weak_intrusive_ptr<LinearPackedParamsBase>;

// Rows are padded to a multiple of this before oneDNN multiplies them by a weight packed for
// that many (PACKED_ROW_MULTIPLE in aiayn/nn/cpu_kernels.py, which passes it on registering).
int64_t row_multiple = 16;

std::mutex table_lock;
std::unordered_map<int64_t, WeakTensor> fp32_weights;
std::unordered_map<int64_t, WeakInt8> int8_weights;

void set_packed(int64_t handle, const at::Tensor& packed, int64_t multiple) {
  std::lock_guard<std::mutex> guard(table_lock);
  fp32_weights.insert_or_assign(handle, WeakTensor(packed.getIntrusivePtr()));
  row_multiple = multiple;
}

void set_int8(int64_t handle, const c10::intrusive_ptr<LinearPackedParamsBase>& weight) {
  std::lock_guard<std::mutex> guard(table_lock);
  int8_weights.insert_or_assign(handle, WeakInt8(weight));
}

at::Tensor fp32_weight(int64_t handle) {
  std::lock_guard<std::mutex> guard(table_lock);
  auto found = fp32_weights.find(handle);
  if (found != fp32_weights.end()) {
    auto strong = found->second.lock();
    if (strong) return at::Tensor(std::move(strong));
  }
  TORCH_CHECK(false, "packed weight ", handle, " is used outside its decoding block");
}

c10::intrusive_ptr<LinearPackedParamsBase> int8_weight(int64_t handle) {
  std::lock_guard<std::mutex> guard(table_lock);
  auto found = int8_weights.find(handle);
  if (found != int8_weights.end()) {
    auto strong = found->second.lock();
    if (strong) return strong;
  }
  TORCH_CHECK(false, "int8 weight handle ", handle, " outlived its layer");
}

// oneDNN's product with a packed weight: torch.ops.mkldnn._linear_pointwise, called through
// the dispatcher as the Python implementation calls it.
at::Tensor onednn_linear(
    const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(
                           const at::Tensor&,
                           const at::Tensor&,
                           const std::optional<at::Tensor>&,
                           std::string_view,
                           c10::List<std::optional<at::Scalar>>,
                           std::optional<std::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// (N, I) fp32 rows times the packed weight `handle`, plus `bias` -> (N, O); `weight` is the
// layer's plain (O, I) weight, which only the fake implementation reads.
at::Tensor packed_linear(
    const at::Tensor& x,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    int64_t handle) {
  at::Tensor packed = fp32_weight(handle);
  const int64_t rows = x.size(0);
  const int64_t extra = (row_multiple - rows % row_multiple) % row_multiple;
  if (extra == 0 || rows <= row_multiple) return onednn_linear(x, packed, bias);
  at::Tensor padded = at::constant_pad_nd(x, {0, 0, 0, extra});  // (N', I)
  return onednn_linear(padded, packed, bias).narrow(0, 0, rows).contiguous();
}

// (N, I) fp32 activations times the packed int8 weight `handle` (bias included) -> (N, O),
// the activations quantized to 7 bits where `reduce_range`, else 8: fbgemm's product as
// torch.ops.quantized.linear_dynamic, called through the dispatcher as the Python
// implementation calls it (so that PyTorch's profiler sees the product here too).
at::Tensor int8_dynamic_linear(
    const at::Tensor& x, const at::Tensor& qweight, int64_t handle, bool reduce_range) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("quantized::linear_dynamic", "")
          .typed<at::Tensor(
              at::Tensor, const c10::intrusive_ptr<LinearPackedParamsBase>&, bool)>();
  return op.call(x, int8_weight(handle), reduce_range);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn, m) {
  m.def("_native_set_packed(int handle, Tensor packed, int row_multiple) -> ()", &set_packed);
  m.def(
      "_native_set_int8(int handle, __torch__.torch.classes.quantized.LinearPackedParamsBase "
      "weight) -> ()",
      &set_int8);
}

TORCH_LIBRARY_IMPL(aiayn, CPU, m) {
  m.impl("packed_linear", &packed_linear);
  m.impl("int8_dynamic_linear", &int8_dynamic_linear);
}
