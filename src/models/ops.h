// Kernels of our own where LibTorch 1.13's CPU ones are slow for the models trainctl trains.
#pragma once

#include <torch/types.h>

namespace trainctl::models {

// relu(max_pool2d(x, 2)) on an N x C x H x W float CPU tensor (H and W even), autograd, in one
// pass each way. The same results as torch::relu(torch::max_pool2d(x, 2)), bit for bit,
// gradients included (the first maximum in row-major order of each window gets the gradient;
// NaN propagates to the output, though where a NaN window's gradient goes may differ). ATen's
// CPU max_pool2d_with_indices is branchy and, on real activations, mispredicts most of its
// comparisons: 7 ms a call for a 64 x 32 x 28 x 28 batch on one core, the largest cost of a
// Fashion-MNIST CNN step; and the ReLU after it is two more passes over memory. Here both
// directions are branch-free AVX2 loops (portable C++ on CPUs without AVX2). Pooling first and
// then the ReLU gives the same result as the other order, on a quarter of the elements.
torch::Tensor MaxPool2x2Relu(const torch::Tensor& x);

}  // namespace trainctl::models
