// oneDNN called directly: the CNN's second convolution in bf16 on a CPU that multiplies in bf16
// (trainer.precision: bf16), in oneDNN's blocked layout up to the pooling after it (models/ops.h
// pools in that layout), and the linear layers' sgemm. Compiled when CMake finds oneDNN (Debian's
// libdnnl-dev: the library that Debian's LibTorch runs its CPU convolutions on);
// TRAINCTL_HAVE_ONEDNN says so. In f32 the CNN's convolutions are the trainer's own
// (models/ops.h): on an AVX-512 Zen 5 its Winograd layer takes 0.75-0.8x the time of Conv3x3's
// f32 kernels (oneDNN's Winograd there) followed by the pooling pass.
//
// Why not ATen's convolution: for every call ATen converts the input, the output and the gradients
// between PyTorch's N x C x H x W and oneDNN's blocked layout (about 1 ms of a 13 ms Fashion-MNIST
// CNN step on one core), and it always asks for the direct algorithm.
#pragma once

#include "models/ops.h"

#include <torch/types.h>

namespace trainctl::models {

// A 3x3 convolution with stride 1 and padding 1 (weight O x I x 3 x 3 and bias O, as
// torch::nn::Conv2d holds them), autograd. x and the result are blocked (models/ops.h; C and O
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
// Whether oneDNN has generated kernels for Conv3x3's layout on this CPU (AVX-512: blocks of 16
// channels). Elsewhere (AVX2 machines) it would run its reference loops, hundreds of times slower
// than ATen's convolutions; the CNN's bf16 path asks first.
bool BlockedConvolutions();

// x * weight^T + bias (torch::nn::Linear's layer) on a float CPU batch, autograd, through oneDNN's
// sgemm: AVX-512 where the CPU has it (Debian's OpenBLAS, which ATen calls, stops at AVX2): the
// CNN's 3136 -> 128 layer takes half the time forward and backward; on AVX2 about 0.8x ATen's
// (the weight's gradient written once, in its layout; bench/conv_layer). Deterministic.
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace trainctl::models
