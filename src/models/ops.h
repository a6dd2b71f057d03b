// Kernels of our own where LibTorch 1.13's CPU ones are slow for the models trainctl trains, and
// the blocked layout they work in.
#pragma once

#include <torch/types.h>

namespace trainctl::models {

// A blocked tensor holds N x C x H x W as N x C/16 x H x W x 16 (oneDNN's nChw16c): the 16
// channels of a position are adjacent. C must be a multiple of 16. It is the layout oneDNN's CPU
// convolutions compute in; keeping activations in it between layers saves the conversions that
// ATen makes around every convolution (models/onednn.h).
constexpr int64_t kBlock = 16;
torch::Tensor ToBlocked(const torch::Tensor& nchw);
torch::Tensor FromBlocked(const torch::Tensor& blocked);
// Throws c10::Error, naming `what`, unless x is a blocked float CPU tensor.
void CheckBlocked(const torch::Tensor& x, const char* what);

// relu(max_pool2d(x, 2)) on a blocked float CPU tensor with even H and W, autograd, in one pass
// each way; the result is blocked. The same results as torch::relu(torch::max_pool2d(x, 2)) on
// the N x C x H x W form, bit for bit, gradients included (the first maximum in row-major order
// of each window gets the gradient; NaN propagates to the output, though where a NaN window's
// gradient goes may differ). ATen's CPU max_pool2d_with_indices is branchy and, on real
// activations, mispredicts most of its comparisons: 7 ms a call for a 64 x 32 x 28 x 28 batch on
// one core, the largest cost of a Fashion-MNIST CNN step; and the ReLU after it is two more
// passes over memory. Here both directions are branch-free AVX2 loops over a position's 16
// channels (portable C++ on CPUs without AVX2); forward keeps one byte per window and channel
// saying where its gradient goes, so backward reads neither x nor the output, and x need not
// outlive the call. Pooling first and then the ReLU gives the same result as the other order, on
// a quarter of the elements.
torch::Tensor MaxPool2x2Relu(const torch::Tensor& x);

}  // namespace trainctl::models
