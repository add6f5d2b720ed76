// The only translation unit that includes torch: it checks tensors and forwards raw pointers to the launchers.
// It includes what it uses, not <torch/extension.h>: that header brings all of ATen's operators, autograd and
// torch::nn, and more than doubles this file's compile time (26 s -> 12 s on one core), which every cold build
// of the demo pays.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>  // pybind11 and its at::Tensor caster

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "launchers.h"

namespace {

void check_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor (factory_demo_ext has no CPU kernels)");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_same(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "shape mismatch: ", a.sizes(), " vs ", b.sizes());
  TORCH_CHECK(a.device() == b.device(), "device mismatch: ", a.device(), " vs ", b.device());
}

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " kernel launch failed: ", cudaGetErrorString(err));
}

at::Tensor add(const at::Tensor& a, const at::Tensor& b) {
#ifdef DEMO_FAIL_HOST
  // The factory's preflight tests build with DEMO_FAIL_HOST=1 to get a real host compiler error here.
  check_input(a, demo_fail_host_undeclared_name);
#endif
  check_input(a, "a");
  check_input(b, "b");
  check_same(a, b);
  const c10::cuda::CUDAGuard guard(a.device());
  auto out = at::empty_like(a);
  check_launch(demo::add_launch(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel(),
                                c10::cuda::getCurrentCUDAStream()),
               "add");
  return out;
}

at::Tensor scale(const at::Tensor& x, double alpha) {
  check_input(x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x);
  check_launch(demo::scale_launch(x.data_ptr<float>(), static_cast<float>(alpha), out.data_ptr<float>(),
                                  x.numel(), c10::cuda::getCurrentCUDAStream()),
               "scale");
  return out;
}

at::Tensor saxpy(double alpha, const at::Tensor& x, const at::Tensor& y) {
  check_input(x, "x");
  check_input(y, "y");
  check_same(x, y);
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x);
  check_launch(demo::saxpy_launch(static_cast<float>(alpha), x.data_ptr<float>(), y.data_ptr<float>(),
                                  out.data_ptr<float>(), x.numel(), c10::cuda::getCurrentCUDAStream()),
               "saxpy");
  return out;
}

at::Tensor relu(const at::Tensor& x) {
  check_input(x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty_like(x);
  check_launch(
      demo::relu_launch(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(), c10::cuda::getCurrentCUDAStream()),
      "relu");
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "factory-demo-ext: tiny elementwise CUDA kernels for exercising the wheel factory";
  m.def("add", &add, "a + b", py::arg("a"), py::arg("b"));
  m.def("scale", &scale, "alpha * x", py::arg("x"), py::arg("alpha"));
  m.def("saxpy", &saxpy, "alpha * x + y", py::arg("alpha"), py::arg("x"), py::arg("y"));
  m.def("relu", &relu, "max(x, 0)", py::arg("x"));
}
