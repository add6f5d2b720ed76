// The only translation unit that includes torch: it checks tensors and forwards raw pointers to the launchers.
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "launchers.h"

namespace {

void check_input(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor (factory_demo_ext has no CPU kernels)");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_same(const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "shape mismatch: ", a.sizes(), " vs ", b.sizes());
  TORCH_CHECK(a.device() == b.device(), "device mismatch: ", a.device(), " vs ", b.device());
}

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " kernel launch failed: ", cudaGetErrorString(err));
}

torch::Tensor add(const torch::Tensor& a, const torch::Tensor& b) {
#ifdef DEMO_FAIL_HOST
  // The factory's preflight tests build with DEMO_FAIL_HOST=1 to get a real host compiler error here.
  check_input(a, demo_fail_host_undeclared_name);
#endif
  check_input(a, "a");
  check_input(b, "b");
  check_same(a, b);
  const c10::cuda::CUDAGuard guard(a.device());
  auto out = torch::empty_like(a);
  check_launch(demo::add_launch(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel(),
                                c10::cuda::getCurrentCUDAStream()),
               "add");
  return out;
}

torch::Tensor scale(const torch::Tensor& x, double alpha) {
  check_input(x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = torch::empty_like(x);
  check_launch(demo::scale_launch(x.data_ptr<float>(), static_cast<float>(alpha), out.data_ptr<float>(),
                                  x.numel(), c10::cuda::getCurrentCUDAStream()),
               "scale");
  return out;
}

torch::Tensor saxpy(double alpha, const torch::Tensor& x, const torch::Tensor& y) {
  check_input(x, "x");
  check_input(y, "y");
  check_same(x, y);
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = torch::empty_like(x);
  check_launch(demo::saxpy_launch(static_cast<float>(alpha), x.data_ptr<float>(), y.data_ptr<float>(),
                                  out.data_ptr<float>(), x.numel(), c10::cuda::getCurrentCUDAStream()),
               "saxpy");
  return out;
}

torch::Tensor relu(const torch::Tensor& x) {
  check_input(x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = torch::empty_like(x);
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
