// Plain C++ launcher declarations shared by the .cu files and the torch binding.
// The .cu files deliberately avoid torch headers: a torch-including TU costs about a minute of nvcc time.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace demo {

// Each launcher returns cudaSuccess or the launch error, so the binding can report it through torch.
cudaError_t add_launch(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
cudaError_t scale_launch(const float* x, float alpha, float* out, int64_t n, cudaStream_t stream);
cudaError_t saxpy_launch(float alpha, const float* x, const float* y, float* out, int64_t n,
                         cudaStream_t stream);
cudaError_t relu_launch(const float* x, float* out, int64_t n, cudaStream_t stream);

}  // namespace demo
