// Kernels of our own where LibTorch 1.13's CPU ones are slow for the models trainctl trains.
#pragma once

#include <torch/types.h>

namespace trainctl::models {

// 2x2 max pooling with stride 2 on an N x C x H x W float CPU tensor (H and W even), autograd.
// The same results as torch::max_pool2d(x, 2), bit for bit, gradients included (the first
// maximum in row-major order of each window gets the gradient; NaN propagates to the output,
// though where a NaN window's gradient goes may differ). ATen's CPU
// max_pool2d_with_indices forward is branchy and, on real activations, mispredicts most of its
// comparisons: 7 ms a call for a 64 x 32 x 28 x 28 batch on one core, the largest cost of a
// Fashion-MNIST CNN step. Here the forward is the elementwise maximum of the windows' four
// corners, and the backward a branch-free SSE2 loop. Input and output must be contiguous float
// tensors on the CPU.
torch::Tensor MaxPool2x2(const torch::Tensor& x);

}  // namespace trainctl::models
