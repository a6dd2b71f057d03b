// oneDNN called directly: the CNN's second convolution in bf16 on a CPU that multiplies in bf16
// (trainer.precision: bf16), in oneDNN's blocked layout up to the pooling after it (kernels/ops.h
// pools in that layout), and the linear layers' sgemm. Compiled when CMake finds oneDNN (Debian's
// libdnnl-dev: the library that Debian's LibTorch runs its CPU convolutions on);
// TRAINCTL_HAVE_ONEDNN says so. In f32 the CNN's convolutions are the trainer's own
// (kernels/ops.h): on an AVX-512 Zen 5 its Winograd layer takes 0.75-0.8x the time of Conv3x3's
// f32 kernels (oneDNN's Winograd there) followed by the pooling pass.
//
// Why not ATen's convolution: for every call ATen converts the input, the output and the gradients
// between PyTorch's N x C x H x W and oneDNN's blocked layout (about 1 ms of a 13 ms Fashion-MNIST
// CNN step on one core), and it always asks for the direct algorithm.
#pragma once

#include <torch/types.h>

#include "kernels/ops.h"

namespace trainctl::kernels {

// A 3x3 convolution with stride 1 and padding 1 (weight O x I x 3 x 3 and bias O, as
// torch::nn::Conv2d holds them), autograd. x and the result are blocked (kernels/ops.h; C and O
// multiples of 16). In f32 oneDNN picks the algorithm (convolution_auto: Winograd where it
// expects it to be faster), so results match ATen's to rounding, not bit for bit.
// Deterministic: the same inputs give the same bits.
// bf16: multiplies in bfloat16 (x, the weight and the output's gradient rounded to it, sums in
// f32; the output and every gradient f32), with oneDNN's direct algorithm: a third less time than
// f32 for the CNN's 32 -> 64 convolution on a CPU with bf16 instructions (Bf16Convolutions()), which
// elsewhere oneDNN emulates, slower than f32.
torch::Tensor Conv3x3(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                      bool bf16 = false);
bool Bf16Convolutions();

// conv2d(x, weight, bias, stride, padding) (a square O x C x k x k weight, groups 1; bias O or
// undefined) through oneDNN, autograd, with no layout conversion of the activations: x
// channels-last N x C x H x W (PyTorch's ChannelsLast; any other memory format is made so) or
// blocked (C and O multiples of 16), the result f32 in the same layout. x may be bf16 (its
// gradient is then bf16 too). bf16 as Conv3x3's; in f32 oneDNN picks Winograd for 3x3 stride 1.
// ATen's convolution around oneDNN converts the input to bf16 and the weight to oneDNN's layout
// as this does, but also makes oneDNN's primitive descriptors on every call and, under autocast,
// returns bf16 that the batch norm after converts back. In bf16 with channels in blocks of 16 a
// channels-last convolution computes in the blocked layout (oneDNN 2.6's channels-last bf16
// kernels are slower), converting its output and its input's gradient back. For the two strided
// convolutions of issue 48's recipe network in bf16 (batch 64, one core, forward and backward):
// 0.56 against ATen's 0.69 ms and 0.89 against 1.11; the network's step 0.83x (bench/RESULTS.md). An undefined result
// where oneDNN has no generated kernels for this shape and layout on this CPU (it would run its reference loops,
// hundreds of times slower than ATen): the caller's to fall back.
torch::Tensor Convolution(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          int64_t stride, int64_t padding, bool bf16);
// Whether oneDNN has generated kernels for Conv3x3's layout on this CPU (AVX-512: blocks of 16
// channels). Elsewhere (AVX2 machines) it would run its reference loops, hundreds of times slower
// than ATen's convolutions; the CNN's bf16 path asks first.
bool BlockedConvolutions();

// x * weight^T + bias (torch::nn::Linear's layer) on a float CPU batch, autograd, through oneDNN's
// sgemm: AVX-512 where the CPU has it (Debian's OpenBLAS, which ATen calls, stops at AVX2): the
// CNN's 3136 -> 128 layer takes half the time forward and backward; on AVX2 about 0.8x ATen's
// (the weight's gradient written once, in its layout; bench/conv_layer). Deterministic.
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace trainctl::kernels
