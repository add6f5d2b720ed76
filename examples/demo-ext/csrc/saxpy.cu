#include "grid.cuh"
#include "launchers.h"

namespace demo {

namespace {

__global__ void saxpy_kernel(float alpha, const float* x, const float* y, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = alpha * x[i] + y[i];
  }
}

}  // namespace

cudaError_t saxpy_launch(float alpha, const float* x, const float* y, float* out, int64_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  saxpy_kernel<<<blocks_for(n), kThreads, 0, stream>>>(alpha, x, y, out, n);
  return cudaGetLastError();
}

}  // namespace demo
