#include "grid.cuh"
#include "launchers.h"

namespace demo {

namespace {

__global__ void relu_kernel(const float* x, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
}

}  // namespace

cudaError_t relu_launch(const float* x, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  relu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, out, n);
  return cudaGetLastError();
}

}  // namespace demo
