// Row softmax used by an older version of the model; kept for the benchmark in bench_softmax.py.
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void row_softmax_kernel(const float* in, float* out, int cols) {
  int row = blockIdx.x;
  const float* x = in + row * cols;
  float* y = out + row * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, x[c]);
  __syncthreads();
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(x[c] - m);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[c] = expf(x[c] - m) / s;
}

torch::Tensor row_softmax(torch::Tensor x) {
  auto out = torch::empty_like(x);
  row_softmax_kernel<<<x.size(0), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.size(1));
  return out;
}
