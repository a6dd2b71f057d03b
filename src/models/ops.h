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

// relu(max_pool2d(x, 2)) on a float CPU tensor with even H and W, blocked (5-D) or N x C x H x W
// (4-D), autograd, in one pass each way; the result is in the same layout. The same results as
// torch::relu(torch::max_pool2d(x, 2)) on the N x C x H x W form, bit for bit, gradients included
// (the first maximum in row-major order of each window gets the gradient; NaN propagates to the
// output, though where a NaN window's gradient goes may differ). ATen's CPU
// max_pool2d_with_indices is branchy and, on real activations, mispredicts most of its
// comparisons: 7 ms a call for a 64 x 32 x 28 x 28 batch on one core, the largest cost of a
// Fashion-MNIST CNN step; and the ReLU after it is two more passes over memory. Here both
// directions are branch-free AVX2 loops, over a position's 16 channels when blocked, over 8
// windows of a row pair otherwise (portable C++ on CPUs without AVX2); forward keeps one byte per
// window and channel saying where its gradient goes, so backward reads neither x nor the output,
// and x need not outlive the call. Pooling first and then the ReLU gives the same result as the
// other order, on a quarter of the elements.
torch::Tensor MaxPool2x2Relu(const torch::Tensor& x);

// A 3x3 convolution, stride 1, padding 1, with bias, of an input that takes no gradient (the
// image: a model's first layer) on the CPU in float, autograd for the weight and the bias; equal
// to torch::conv2d to rounding. For the few input channels of an image (1 for Fashion-MNIST, 3 for
// CIFAR-10) ATen's oneDNN convolution pads them to a block of 8 (on AVX2) and reorders its
// 6.4 MB output and gradient between layouts each step: its weight gradient alone took 5 ms a
// batch of 64 on one core, an eighth of the example CNN's step. Here an image's 9 x C shifted
// copies (a few KB to 100 KB) stay in cache while each output channel's row is computed from
// them, and the weight gradient is the dot products of the output's gradient with the same
// copies; AVX2 and FMA where the CPU has them (portable C++ elsewhere). x must not require grad.
torch::Tensor Conv3x3ImageLayer(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// A 3x3 convolution, stride 1, padding 1, with bias, on the CPU in float, autograd; equal to
// torch::conv2d to rounding (Winograd's arithmetic rounds differently: about 1e-6 of the output's
// scale). C and O must be multiples of 16, H and W even. The forward pass and the input's gradient
// by Winograd's F(2x2, 3x3) on AVX2 and FMA (models/winograd.cc: 2.25x fewer multiplications);
// the weight's and the bias's gradients by ATen. Where oneDNN has no Winograd kernels (CPUs
// without AVX-512) ATen's direct convolution took 10 ms for the example CNN's 32 -> 64 layer on a
// batch of 64 on one core, this 4.3 ms. torch::conv2d where the CPU lacks AVX2 or FMA.
torch::Tensor Conv3x3Winograd(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
// Whether Conv3x3Winograd runs its own kernels on this CPU (AVX2 and FMA).
bool WinogradConvolutions();

}  // namespace trainctl::models
