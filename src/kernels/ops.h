// Kernels of our own where LibTorch 1.13's CPU ones are slow for the models trainctl trains, and
// the blocked layout they work in.
#pragma once

#include <torch/types.h>

namespace trainctl::kernels {

// A blocked tensor holds N x C x H x W as N x C/16 x H x W x 16 (oneDNN's nChw16c): the 16
// channels of a position are adjacent. C must be a multiple of 16. It is the layout oneDNN's CPU
// convolutions compute in; keeping activations in it between layers saves the conversions that
// ATen makes around every convolution (kernels/onednn.h).
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
// other order, on a quarter of the elements. relu = false: max_pool2d(x, 2) alone (where batch
// norm stands between the pooling and the ReLU), every window's gradient going to its maximum.
torch::Tensor MaxPool2x2Relu(const torch::Tensor& x, bool relu = true);

// relu(max_pool2d(conv2d(x, weight, bias, stride 1, padding 1), 2)) on the CPU in float, autograd:
// the CNN's two layers, in kernels of our own on AVX2 and FMA (kernels/conv_pool.cc) that pool the
// convolution's output while it is still in cache and build the convolution's output gradient
// from the pooled one the same way, so that neither the full-size output nor its gradient crosses
// the batch in memory (6.4 MB and 3.2 MB a batch of 64 for the example CNN's two layers). Equal to
// ATen's to rounding; the pooling and its gradient follow MaxPool2x2Relu's rules on the
// convolution's output. H and W even, O a multiple of 16. Where the CPU lacks AVX2 or FMA, ATen's
// convolution and MaxPool2x2Relu. relu = false leaves the ReLU out, as MaxPool2x2Relu's does: a
// convolution, maxpool and batch norm before the ReLU (issue 48's recipe: conv, maxpool, BN, ReLU).
//
// ImageConvPoolRelu is the first layer, on an image that takes no gradient (x must not require
// grad: the weight's and bias's gradients only), and leaves its output channels-last (PyTorch's
// ChannelsLast memory format), as ConvPoolRelu reads it. For the few input channels of an image
// (1 for Fashion-MNIST, 3 for CIFAR-10) ATen's oneDNN convolution pads them to a block of 8 (on
// AVX2) and reorders its 6.4 MB output and gradient between layouts each step: its weight
// gradient alone took 5 ms a batch of 64 on one core. Here an image's 9 x C shifted copies (a few
// KB to 100 KB) stay in cache for the two matrix products: the output (positions x O) and the
// weight's gradient.
torch::Tensor ImageConvPoolRelu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                bool relu = true);

// ConvPoolRelu is a hidden layer: C a multiple of 16 too; any memory format in, N x C x H x W
// out. Its convolution is Winograd's F(2x2, 3x3) (2.25x fewer multiplications, rounding about
// 1e-6 of the output's scale differently from ATen's), forward and all three gradients; a
// Winograd tile's 2 x 2 outputs are one pooling window. Where oneDNN has no Winograd kernels
// (CPUs without AVX-512) ATen's direct convolution took 10 ms for the example CNN's 32 -> 64
// layer on a batch of 64 on one core, forward only.
torch::Tensor ConvPoolRelu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                           bool relu = true);
// Whether the two run their own kernels on this CPU (AVX2 and FMA): Winograd for ConvPoolRelu.
bool WinogradConvolutions();
// ConvPoolRelu's matrix products run on AVX-512 where the CPU has it, in blocks of 32 output
// channels instead of 16 (0.6x the layer's time on a Zen 5), and ImageConvPoolRelu's 16 output
// channels a register; each sum is the same chain of FMAs, so the results are the same bits as on
// AVX2. For tests: false keeps them on AVX2.
void AllowAvx512Products(bool allow);
// Whether they do now (the CPU has AVX-512 and no test said otherwise); BatchNormRelu's passes
// follow it too.
bool Avx512Products();

// relu(batch_norm(x)) in training (relu = false: batch_norm alone) on a float CPU N x C x H x W
// tensor of any memory format, autograd; the output channels-last. The batch's mean and biased
// variance normalize; the running statistics, where given, move by momentum toward the mean and
// the unbiased variance, as torch::nn::BatchNorm2d's do. The same results as ATen's to rounding:
// sums in double, over fixed runs of rows whatever the number of threads. Two passes each way
// (ATen 1.13's batch norm and ReLU make five, some element by element in channels-last).
torch::Tensor BatchNormRelu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            const torch::Tensor& running_mean, const torch::Tensor& running_var, double momentum,
                            double eps, bool relu);

}  // namespace trainctl::kernels
