#include "grid.cuh"
#include "launchers.h"

// The factory's failure tests build with DEMO_FAIL_COMPILE=1 to get a real nvcc error in one translation unit.
#ifdef DEMO_FAIL_COMPILE
#error "DEMO_FAIL_COMPILE is set: this translation unit refuses to compile"
#endif

namespace demo {

namespace {

__global__ void scale_kernel(const float* x, float alpha, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = alpha * x[i];
  }
}

}  // namespace

cudaError_t scale_launch(const float* x, float alpha, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, alpha, out, n);
  return cudaGetLastError();
}

}  // namespace demo
