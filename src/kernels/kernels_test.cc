// Unit tests of the CPU kernels (kernels/): each against ATen's own operations, forward and
// backward, in both layouts, and AVX-512 against AVX2 bit for bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <functional>
#include <thread>

#include "common/cpus.h"
#include "kernels/ops.h"
#if TRAINCTL_HAVE_ONEDNN
#include "kernels/onednn.h"
#endif

namespace trainctl::kernels {
namespace {

TEST(Ops, BlockedLayoutRoundTrips) {
  torch::Tensor x = torch::randn({2, 32, 5, 6});
  torch::Tensor b = kernels::ToBlocked(x);
  EXPECT_EQ(b.sizes().vec(), (std::vector<int64_t>{2, 2, 5, 6, 16}));
  EXPECT_EQ(b[1][1][4][3][7].item<float>(), x[1][16 + 7][4][3].item<float>());  // channel 23
  EXPECT_TRUE(torch::equal(kernels::FromBlocked(b), x));
  // Channels-last in memory, as the first layer leaves it: the same blocked tensor.
  EXPECT_TRUE(torch::equal(kernels::ToBlocked(x.contiguous(at::MemoryFormat::ChannelsLast)), b));
}

// In both layouts: blocked (the oneDNN path) and N x C x H x W as ATen's convolutions leave it,
// whose AVX2 kernel takes 8 windows of a row at a time: widths whose half is not a multiple of 8
// (28 -> 14, 14 -> 7, 6 -> 3, 34 -> 17, 2 -> 1) end in a partial block.
// Without the ReLU too (relu = false: max_pool2d alone, every window's gradient to its maximum).
TEST(Ops, MaxPool2x2ReluMatchesTorchBitForBitWithTies) {
  torch::manual_seed(5);
  for (bool relu : {true, false}) {
    SCOPED_TRACE(relu ? "with the relu" : "without the relu");
    const auto pool = [relu](const torch::Tensor& x, bool blocked) {
      return blocked ? kernels::FromBlocked(kernels::MaxPool2x2Relu(kernels::ToBlocked(x), relu))
                     : kernels::MaxPool2x2Relu(x, relu);
    };
    const auto aten = [relu](const torch::Tensor& x) {
      return relu ? torch::relu(torch::max_pool2d(x, 2)) : torch::max_pool2d(x, 2);
    };
    for (bool blocked : {true, false}) {
      // Small integers, negatives included, make many ties inside windows and many windows that
      // the ReLU zeroes: the gradient must go where ATen sends it.
      for (auto shape : {std::vector<int64_t>{3, 16, 8, 6},
                         {2, 32, 28, 28},
                         {2, 64, 14, 14},
                         {1, 16, 4, 34},
                         {2, 16, 6, 2},
                         {1, 16, 2, 32}}) {
        for (bool ties : {true, false}) {
          torch::Tensor base = ties ? torch::randint(-2, 3, shape).to(torch::kFloat32) : torch::randn(shape);
          torch::Tensor a = base.clone().requires_grad_(true);
          torch::Tensor b = base.clone().requires_grad_(true);
          torch::Tensor ours = pool(a, blocked);
          torch::Tensor theirs = aten(b);
          EXPECT_TRUE(torch::equal(ours, theirs)) << shape[3] << " blocked " << blocked;
          torch::Tensor g = torch::randn(ours.sizes());
          ours.backward(g);
          theirs.backward(g);
          EXPECT_TRUE(torch::equal(a.grad(), b.grad())) << shape[3] << " ties " << ties << " blocked " << blocked;
        }
      }
      // NaN propagates to the window's output.
      torch::Tensor base = torch::randn({2, 16, 8, 40});
      base.view(-1).index_put_({torch::tensor({7, 100, 201, 333, 1000, 5000})}, std::nanf(""));
      EXPECT_TRUE(torch::equal(pool(base, blocked).isnan(), aten(base).isnan()));
    }
  }
  EXPECT_THROW(kernels::MaxPool2x2Relu(torch::randn({16, 8, 40})), c10::Error);    // neither layout
  EXPECT_THROW(kernels::MaxPool2x2Relu(torch::randn({1, 16, 8, 5})), c10::Error);  // odd width
  EXPECT_THROW(kernels::MaxPool2x2Relu(torch::randn({1, 16, 8, 8}, torch::kFloat64)), c10::Error);
}

// relu(max_pool2d(conv2d(x, w, b, 1, 1), 2)) by ATen (relu false: without the relu), for the fused
// layers to match.
torch::Tensor AtenConvPoolRelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, bool relu) {
  torch::Tensor y = torch::max_pool2d(torch::conv2d(x, w, b, /*stride=*/1, /*padding=*/1), 2);
  return relu ? torch::relu(y) : y;
}

using ConvPoolLayer = torch::Tensor (*)(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, bool);

// A fused layer (ops.h) against ATen: the output and the gradients of x (where it takes one), the
// weight and the bias. On random floats to rounding (1e-5, or 1e-4 for the first layer's long dot
// products, of the largest magnitude); on small integers exactly, where ties inside windows are
// common (Winograd's arithmetic is exact on them too) and the gradient must go where ATen's does.
void ExpectConvPoolMatchesAten(ConvPoolLayer layer, std::array<int64_t, 5> shape, bool input_grad, bool ties,
                               float tolerance, bool relu) {
  const auto [n, c, o, h, w] = shape;
  const std::string name = std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" +
                           std::to_string(w) + " -> " + std::to_string(o) + (ties ? " integers" : "") +
                           (relu ? "" : " without the relu");
  const auto draw = [&](std::vector<int64_t> sizes, double scale) {
    return ties ? torch::randint(-2, 3, sizes).to(torch::kFloat32) : torch::randn(sizes) * scale;
  };
  torch::Tensor x = draw({n, c, h, w}, 1), weight = draw({o, c, 3, 3}, 0.1), bias = draw({o}, 1);
  const auto close = [&](const torch::Tensor& got, const torch::Tensor& want) {
    if (ties) return torch::equal(got, want);
    return (got - want).abs().max().item<float>() <= tolerance * std::max(1.0f, want.abs().max().item<float>());
  };
  torch::Tensor x1 = x.clone().requires_grad_(input_grad), x2 = x.clone().requires_grad_(input_grad);
  torch::Tensor w1 = weight.clone().requires_grad_(true), b1 = bias.clone().requires_grad_(true);
  torch::Tensor w2 = weight.clone().requires_grad_(true), b2 = bias.clone().requires_grad_(true);
  torch::Tensor ours = layer(x1, w1, b1, relu);
  torch::Tensor theirs = AtenConvPoolRelu(x2, w2, b2, relu);
  ASSERT_EQ(ours.sizes(), theirs.sizes()) << name;
  EXPECT_TRUE(close(ours, theirs)) << name;
  torch::Tensor g = ties ? torch::randint(-3, 4, ours.sizes()).to(torch::kFloat32) : torch::randn(ours.sizes());
  ours.backward(g);
  theirs.backward(g);
  if (input_grad) {
    EXPECT_TRUE(close(x1.grad(), x2.grad())) << "input gradient " << name;
  }
  EXPECT_TRUE(close(w1.grad(), w2.grad())) << "weight gradient " << name;
  EXPECT_TRUE(close(b1.grad(), b2.grad())) << "bias gradient " << name;
}

// The first layer: 1 and 3 channels, positions a multiple of the product's 6 rows and not, more
// than one group of the weight gradient's sum. On a CPU without AVX2 and FMA it is ATen's own.
TEST(Ops, ImageConvPoolReluMatchesAtens) {
  torch::manual_seed(3);
  for (auto shape :
       {std::array<int64_t, 5>{64, 1, 32, 28, 28}, {2, 3, 16, 32, 32}, {9, 1, 16, 6, 10}, {1, 3, 32, 2, 2}}) {
    for (bool ties : {false, true}) {
      for (bool relu : {true, false}) {
        ExpectConvPoolMatchesAten(kernels::ImageConvPoolRelu, shape, /*input_grad=*/false, ties, 1e-4f, relu);
      }
    }
  }
  torch::Tensor x = torch::randn({2, 1, 8, 8});
  EXPECT_THROW(kernels::ImageConvPoolRelu(x.requires_grad_(true), torch::randn({16, 1, 3, 3}), torch::randn({16})),
               c10::Error);  // no gradient for the input
  EXPECT_THROW(kernels::ImageConvPoolRelu(torch::randn({2, 1, 8, 8}), torch::randn({16, 2, 3, 3}), torch::randn({16})),
               c10::Error);  // channels differ
  EXPECT_THROW(kernels::ImageConvPoolRelu(torch::randn({2, 1, 8, 7}), torch::randn({16, 1, 3, 3}), torch::randn({16})),
               c10::Error);  // odd width
  EXPECT_THROW(kernels::ImageConvPoolRelu(torch::randn({2, 1, 8, 8}), torch::randn({8, 1, 3, 3}), torch::randn({8})),
               c10::Error);  // 8 output channels
}

// The hidden layer by Winograd: the CNN's 32 -> 64, and shapes whose tiles are not a multiple of
// the kernel's 6 rows, with several images for LibTorch's threads and more than one group of the
// weight gradient's sum; 6 x 10 then 10 x 6, planes of one size and another shape in the same
// threads' scratch buffers. On a CPU without AVX2 and FMA it is ATen's own.
TEST(Ops, ConvPoolReluMatchesAtens) {
  if (!kernels::WinogradConvolutions()) {
    GTEST_LOG_(INFO) << "no AVX2 and FMA here: ATen's convolution is compared with itself";
  }
  torch::manual_seed(5);
  for (auto shape : {std::array<int64_t, 5>{9, 32, 64, 14, 14},
                     {3, 16, 32, 6, 10},
                     {3, 16, 32, 10, 6},
                     {2, 48, 16, 2, 2},
                     {1, 16, 16, 16, 4}}) {
    for (bool ties : {false, true}) {
      for (bool relu : {true, false}) {
        ExpectConvPoolMatchesAten(kernels::ConvPoolRelu, shape, /*input_grad=*/true, ties, 1e-5f, relu);
      }
    }
  }
  // An empty batch: an empty output, zero gradients.
  torch::Tensor w0 = torch::randn({16, 16, 3, 3}).requires_grad_(true), b0 = torch::randn({16}).requires_grad_(true);
  torch::Tensor y0 = kernels::ConvPoolRelu(torch::randn({0, 16, 4, 4}), w0, b0);
  EXPECT_EQ(y0.sizes(), torch::IntArrayRef({0, 16, 2, 2}));
  y0.sum().backward();
  EXPECT_TRUE(w0.grad().eq(0).all().item<bool>());
  EXPECT_TRUE(b0.grad().eq(0).all().item<bool>());
  EXPECT_THROW(kernels::ConvPoolRelu(torch::randn({2, 8, 8, 8}), torch::randn({16, 8, 3, 3}), torch::randn({16})),
               c10::Error);  // 8 channels
  EXPECT_THROW(kernels::ConvPoolRelu(torch::randn({2, 16, 7, 8}), torch::randn({16, 16, 3, 3}), torch::randn({16})),
               c10::Error);  // odd height
}

// Batch norm in training and the ReLU after it against ATen's: the output, the three gradients and
// the running statistics, channels-last and not, C a multiple of 8 (AVX2) and not (portable), more
// rows than one run of the sums; the same bits with one thread and two.
TEST(Ops, BatchNormReluMatchesAtens) {
  torch::manual_seed(9);
  const auto close = [](const torch::Tensor& got, const torch::Tensor& want, float tolerance) {
    return (got - want).abs().max().item<float>() <= tolerance * std::max(1.0f, want.abs().max().item<float>());
  };
  for (auto shape : {std::vector<int64_t>{64, 16, 14, 14}, {3, 12, 5, 7}, {2, 48, 7, 7}, {4, 16, 40, 40}}) {
    for (bool channels_last : {true, false}) {
      for (bool relu : {true, false}) {
        const std::string name = std::to_string(shape[1]) + " channels, " + std::to_string(shape[2]) + "x" +
                                 std::to_string(shape[3]) + (channels_last ? " channels-last" : "") +
                                 (relu ? " with the relu" : "");
        torch::Tensor x = torch::randn(shape) * 3 + 1;
        if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
        torch::Tensor w = torch::rand({shape[1]}) + 0.5, b = torch::randn({shape[1]});
        torch::Tensor x1 = x.clone().requires_grad_(true), w1 = w.clone().requires_grad_(true),
                      b1 = b.clone().requires_grad_(true);
        torch::Tensor x2 = x.clone().requires_grad_(true), w2 = w.clone().requires_grad_(true),
                      b2 = b.clone().requires_grad_(true);
        torch::Tensor m1 = torch::randn({shape[1]}), v1 = torch::rand({shape[1]}) + 1;
        torch::Tensor m2 = m1.clone(), v2 = v1.clone();
        torch::Tensor ours = kernels::BatchNormRelu(x1, w1, b1, m1, v1, 0.1, 1e-5, relu);
        torch::Tensor theirs = torch::batch_norm(x2, w2, b2, m2, v2, /*training=*/true, 0.1, 1e-5, false);
        if (relu) theirs = torch::relu(theirs);
        EXPECT_TRUE(close(ours, theirs, 1e-5f)) << name;
        EXPECT_TRUE(close(m1, m2, 1e-6f) && close(v1, v2, 1e-5f)) << "running statistics, " << name;
        torch::Tensor g = torch::randn(shape);
        ours.backward(g);
        theirs.backward(g);
        EXPECT_TRUE(close(x1.grad(), x2.grad(), 1e-4f)) << "input gradient, " << name;
        EXPECT_TRUE(close(w1.grad(), w2.grad(), 1e-4f)) << "weight gradient, " << name;
        EXPECT_TRUE(close(b1.grad(), b2.grad(), 1e-4f)) << "bias gradient, " << name;
      }
    }
  }
  // The sums do not depend on the threads.
  torch::Tensor x = torch::randn({8, 16, 40, 40}), w = torch::ones({16}), b = torch::zeros({16});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  torch::Tensor one = kernels::BatchNormRelu(x, w, b, {}, {}, 0, 1e-5, true);
  at::set_num_threads(2);
  torch::Tensor two = kernels::BatchNormRelu(x, w, b, {}, {}, 0, 1e-5, true);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, two));
  EXPECT_THROW(kernels::BatchNormRelu(torch::randn({1, 16, 1, 1}), w, b, {}, {}, 0.1, 1e-5, true), c10::Error);
  EXPECT_THROW(kernels::BatchNormRelu(torch::randn({2, 8, 3, 3}), w, b, {}, {}, 0.1, 1e-5, true), c10::Error);
}

// The hidden layer's matrix products on AVX-512 are the same chains of FMAs as on AVX2: the
// output and every gradient the same bits, for the CNN's shape and one of a last 16 columns.
TEST(Ops, TheAvx512KernelsGiveTheSameBitsAsAvx2) {
  if (!kernels::WinogradConvolutions() || !CpuHasAvx512()) GTEST_SKIP() << "needs a CPU with AVX-512";
  torch::manual_seed(8);
  for (auto shape : {std::array<int64_t, 4>{5, 32, 64, 14}, {3, 48, 48, 6}}) {
    const auto [n, in, out, size] = shape;
    torch::Tensor x = torch::randn({n, in, size, size}).contiguous(at::MemoryFormat::ChannelsLast);
    torch::Tensor w = torch::randn({out, in, 3, 3}) * 0.1, b = torch::randn({out});
    torch::Tensor g = torch::randn({n, out, size / 2, size / 2});
    std::vector<torch::Tensor> results[2];
    for (bool wide : {true, false}) {
      kernels::AllowAvx512Products(wide);
      torch::Tensor xs = x.clone().requires_grad_(true), ws = w.clone().requires_grad_(true),
                    bs = b.clone().requires_grad_(true);
      torch::Tensor y = kernels::ConvPoolRelu(xs, ws, bs);
      y.backward(g);
      results[wide] = {y, xs.grad(), ws.grad(), bs.grad()};
    }
    kernels::AllowAvx512Products(true);
    for (int k = 0; k < 4; ++k)
      EXPECT_TRUE(torch::equal(results[0][k], results[1][k])) << "result " << k << " of " << in;
  }
  // The first layer too (16 output channels a register), with and without its ReLU.
  for (auto [n, c, out] : {std::array<int64_t, 3>{5, 1, 16}, {3, 3, 32}}) {
    for (bool relu : {true, false}) {
      torch::Tensor x = torch::randn({n, c, 12, 10});
      torch::Tensor w = torch::randn({out, c, 3, 3}) * 0.3, b = torch::randn({out});
      torch::Tensor g = torch::randn({n, out, 6, 5});
      std::vector<torch::Tensor> results[2];
      for (bool wide : {true, false}) {
        kernels::AllowAvx512Products(wide);
        torch::Tensor ws = w.clone().requires_grad_(true), bs = b.clone().requires_grad_(true);
        torch::Tensor y = kernels::ImageConvPoolRelu(x, ws, bs, relu);
        y.backward(g);
        results[wide] = {y, ws.grad(), bs.grad()};
      }
      kernels::AllowAvx512Products(true);
      for (int k = 0; k < 3; ++k) {
        EXPECT_TRUE(torch::equal(results[0][k], results[1][k]))
            << "image layer result " << k << " of " << c << " relu " << relu;
      }
    }
  }
  // Batch norm's passes (16 channels a register), with and without the ReLU.
  for (int64_t c : {16, 48}) {
    for (bool relu : {true, false}) {
      torch::Tensor x = (torch::randn({6, c, 9, 7}) * 3 + 5).contiguous(at::MemoryFormat::ChannelsLast);
      torch::Tensor w = torch::rand({c}) + 0.5, b = torch::randn({c}), g = torch::randn({6, c, 9, 7});
      std::vector<torch::Tensor> results[2];
      for (bool wide : {true, false}) {
        kernels::AllowAvx512Products(wide);
        torch::Tensor xs = x.clone().requires_grad_(true), ws = w.clone().requires_grad_(true),
                      bs = b.clone().requires_grad_(true);
        torch::Tensor mean = torch::zeros({c}), var = torch::ones({c});
        torch::Tensor y = kernels::BatchNormRelu(xs, ws, bs, mean, var, 0.1, 1e-5, relu);
        y.backward(g);
        results[wide] = {y, xs.grad(), ws.grad(), bs.grad(), mean, var};
      }
      kernels::AllowAvx512Products(true);
      for (int k = 0; k < 6; ++k) {
        EXPECT_TRUE(torch::equal(results[0][k], results[1][k]))
            << "batch norm result " << k << " of " << c << " relu " << relu;
      }
    }
  }
}

#if TRAINCTL_HAVE_ONEDNN
// Equal to rounding: the largest difference at most 1e-5 of the expected magnitude (at least 1).
bool Close(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<float>() <= 1e-5f * std::max(1.0f, want.abs().max().item<float>());
}

// Our oneDNN convolution against ATen's, forward and backward, for the CNN's 32 -> 64 shape and
// another (Winograd where oneDNN picks it, so equal to rounding, not bit for bit).
TEST(OneDnn, Conv3x3MatchesAtensConvolutionForwardAndBackward) {
  if (!kernels::BlockedConvolutions()) GTEST_SKIP() << "oneDNN has no blocked kernels on this CPU (AVX-512's)";
  torch::manual_seed(11);
  // The batch of 64: oneDNN takes Winograd for the 32-channel shape at that size on AVX-512.
  for (auto [batch, in, out, side] : {std::array<int64_t, 4>{64, 32, 64, 14}, {5, 32, 64, 14}, {3, 16, 32, 8}}) {
    torch::Tensor x = torch::randn({batch, in, side, side});
    torch::Tensor w = (torch::randn({out, in, 3, 3}) * 0.2).requires_grad_(true);
    torch::Tensor bias = torch::randn({out}).requires_grad_(true);
    torch::Tensor w2 = w.detach().clone().requires_grad_(true), bias2 = bias.detach().clone().requires_grad_(true);
    torch::Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    torch::Tensor ours = kernels::FromBlocked(kernels::Conv3x3(kernels::ToBlocked(xa), w, bias));
    torch::Tensor theirs = torch::conv2d(xb, w2, bias2, 1, 1);
    EXPECT_TRUE(Close(ours, theirs)) << in << " -> " << out;
    torch::Tensor g = torch::randn(ours.sizes());
    ours.backward(g);
    theirs.backward(g);
    EXPECT_TRUE(Close(w.grad(), w2.grad())) << in;
    EXPECT_TRUE(Close(bias.grad(), bias2.grad())) << in;
    EXPECT_TRUE(Close(xa.grad(), xb.grad())) << in;
    // The same inputs give the same bits.
    torch::Tensor again = kernels::FromBlocked(kernels::Conv3x3(kernels::ToBlocked(x), w, bias));
    EXPECT_TRUE(torch::equal(again, ours.detach()));
  }
  EXPECT_THROW(kernels::Conv3x3(torch::randn({2, 32, 8, 8}), torch::randn({16, 32, 3, 3}), torch::randn({16})),
               c10::Error);  // 32 channels, not blocked
  EXPECT_THROW(kernels::Conv3x3(torch::randn({2, 1, 8, 8}), torch::randn({16, 1, 3, 3}), torch::randn({16})),
               c10::Error);  // an image's channels: the first layer is kernels::ImageConvPoolRelu
  EXPECT_THROW(kernels::Conv3x3(kernels::ToBlocked(torch::randn({2, 16, 8, 8})), torch::randn({16, 16, 5, 5}),
                                torch::randn({16})),
               c10::Error);  // not 3x3
}

// In bf16 the convolution multiplies x, the weight and the output's gradient rounded to bf16 and
// sums in f32: equal, to f32 rounding, to ATen's f32 convolution of the rounded values (a product
// of two bf16 is exact in f32), forward and backward; and far from the f32 result on unrounded
// values, so the test sees that bf16 was used.
TEST(OneDnn, Conv3x3InBf16IsTheF32ConvolutionOfBf16RoundedValues) {
  if (!kernels::Bf16Convolutions()) GTEST_SKIP() << "this CPU has no bf16 instructions";
  torch::manual_seed(12);
  auto round = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat32); };
  for (int64_t batch : {64, 5}) {
    torch::Tensor x = torch::randn({batch, 32, 14, 14});
    torch::Tensor w = (torch::randn({64, 32, 3, 3}) * 0.2).requires_grad_(true);
    torch::Tensor bias = torch::randn({64}).requires_grad_(true);
    torch::Tensor xa = x.clone().requires_grad_(true);
    torch::Tensor ours = kernels::FromBlocked(kernels::Conv3x3(kernels::ToBlocked(xa), w, bias, /*bf16=*/true));
    EXPECT_EQ(ours.scalar_type(), torch::kFloat32);
    torch::Tensor w2 = round(w.detach()).requires_grad_(true), bias2 = bias.detach().clone().requires_grad_(true);
    torch::Tensor xb = round(x).requires_grad_(true);
    torch::Tensor theirs = torch::conv2d(xb, w2, bias2, 1, 1);
    EXPECT_TRUE(Close(ours, theirs)) << batch;
    EXPECT_FALSE(Close(ours, torch::conv2d(x, w.detach(), bias.detach(), 1, 1))) << "not in bf16";
    torch::Tensor g = torch::randn(ours.sizes());
    ours.backward(g);
    theirs.backward(round(g));
    EXPECT_TRUE(Close(w.grad(), w2.grad())) << batch;
    EXPECT_TRUE(Close(bias.grad(), bias2.grad())) << batch;
    EXPECT_TRUE(Close(xa.grad(), xb.grad())) << batch;
  }
}

// Any convolution (kernel, stride, padding, bias or none) through oneDNN without layout
// conversions: from N x C x H x W or channels-last input, a channels-last f32 result equal to
// ATen's to rounding, and the three gradients too; the same bits again for the same inputs. In bf16
// it is the f32 convolution of bf16-rounded values, as Conv3x3's, and a bf16 input gets a bf16
// gradient.
TEST(OneDnn, ConvolutionMatchesAtensForAnyShapeAndLayout) {
  torch::manual_seed(13);
  struct Case {
    std::array<int64_t, 4> x;
    int64_t out, kernel, stride, padding;
    bool bias;
  };
  const std::vector<Case> cases = {{{8, 16, 14, 14}, 48, 3, 2, 1, true},  // the recipe's two strided layers
                                   {{5, 48, 7, 7}, 96, 3, 2, 1, true},
                                   {{3, 3, 15, 17}, 8, 7, 2, 3, false},  // a ResNet's stem, odd sizes
                                   {{4, 12, 9, 9}, 20, 1, 1, 0, false},
                                   {{2, 16, 8, 8}, 16, 3, 1, 1, true}};
  for (const Case& c : cases) {
    for (bool channels_last : {false, true}) {
      SCOPED_TRACE(std::to_string(c.x[1]) + " -> " + std::to_string(c.out) + " kernel " + std::to_string(c.kernel) +
                   (channels_last ? " channels-last" : ""));
      torch::Tensor x = torch::randn({c.x[0], c.x[1], c.x[2], c.x[3]});
      if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
      torch::Tensor w = (torch::randn({c.out, c.x[1], c.kernel, c.kernel}) * 0.2).requires_grad_(true);
      torch::Tensor bias = c.bias ? torch::randn({c.out}).requires_grad_(true) : torch::Tensor();
      torch::Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
      torch::Tensor w2 = w.detach().clone().requires_grad_(true);
      torch::Tensor bias2 = c.bias ? bias.detach().clone().requires_grad_(true) : torch::Tensor();
      torch::Tensor ours = kernels::Convolution(xa, w, bias, c.stride, c.padding, /*bf16=*/false);
      ASSERT_TRUE(ours.defined()) << "no generated kernels";
      EXPECT_TRUE(ours.is_contiguous(at::MemoryFormat::ChannelsLast));
      torch::Tensor theirs = torch::conv2d(xb, w2, bias2, c.stride, c.padding);
      ASSERT_EQ(ours.sizes(), theirs.sizes());
      EXPECT_TRUE(Close(ours, theirs)) << (ours - theirs).abs().max().item<float>();
      torch::Tensor g = torch::randn(ours.sizes());
      ours.backward(g);
      theirs.backward(g);
      EXPECT_TRUE(Close(w.grad(), w2.grad())) << (w.grad() - w2.grad()).abs().max().item<float>();
      if (c.bias) {
        EXPECT_TRUE(Close(bias.grad(), bias2.grad()));
      }
      EXPECT_TRUE(Close(xa.grad(), xb.grad())) << (xa.grad() - xb.grad()).abs().max().item<float>();
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::equal(kernels::Convolution(x, w, bias, c.stride, c.padding, false), ours));
    }
  }
  EXPECT_THROW(kernels::Convolution(torch::randn({2, 8, 8, 8}), torch::randn({16, 4, 3, 3}), {}, 1, 1, false),
               c10::Error);  // the weight's channels are not the input's
  EXPECT_THROW(kernels::Convolution(torch::randn({2, 8, 2, 2}), torch::randn({16, 8, 5, 5}), {}, 1, 0, false),
               c10::Error);  // the window does not fit
  if (!kernels::Bf16Convolutions()) return;
  auto round = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat32); };
  for (bool bf16_input : {false, true}) {
    torch::Tensor x = torch::randn({8, 16, 14, 14}).contiguous(at::MemoryFormat::ChannelsLast);
    if (bf16_input) x = x.to(torch::kBFloat16);
    torch::Tensor w = (torch::randn({48, 16, 3, 3}) * 0.2).requires_grad_(true);
    torch::Tensor bias = torch::randn({48}).requires_grad_(true);
    torch::Tensor xa = x.clone().requires_grad_(true);
    torch::Tensor ours = kernels::Convolution(xa, w, bias, 2, 1, /*bf16=*/true);
    ASSERT_TRUE(ours.defined());
    EXPECT_EQ(ours.scalar_type(), torch::kFloat32);
    torch::Tensor w2 = round(w.detach()).requires_grad_(true), bias2 = bias.detach().clone().requires_grad_(true);
    torch::Tensor xb = round(x.to(torch::kFloat32)).requires_grad_(true);
    torch::Tensor theirs = torch::conv2d(xb, w2, bias2, 2, 1);
    EXPECT_TRUE(Close(ours, theirs)) << bf16_input;
    EXPECT_FALSE(Close(ours, torch::conv2d(x.to(torch::kFloat32), w.detach(), bias.detach(), 2, 1))) << "not in bf16";
    torch::Tensor g = torch::randn(ours.sizes());
    ours.backward(g);
    theirs.backward(round(g));
    EXPECT_TRUE(Close(w.grad(), w2.grad()));
    EXPECT_TRUE(Close(bias.grad(), bias2.grad()));
    EXPECT_EQ(xa.grad().scalar_type(), x.scalar_type());
    EXPECT_TRUE(Close(xa.grad().to(torch::kFloat32), bf16_input ? round(xb.grad()) : xb.grad()));
  }
}

TEST(OneDnn, LinearMatchesTorchsForwardAndBackward) {
  torch::manual_seed(12);
  for (auto [batch, in, out] : {std::array<int64_t, 3>{64, 3136, 128}, {7, 128, 10}}) {
    torch::Tensor x = torch::randn({batch, in});
    torch::Tensor w = (torch::randn({out, in}) * 0.05).requires_grad_(true);
    torch::Tensor b = torch::randn({out}).requires_grad_(true);
    torch::Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    torch::Tensor w2 = w.detach().clone().requires_grad_(true), b2 = b.detach().clone().requires_grad_(true);
    torch::Tensor ours = kernels::Linear(xa, w, b), theirs = torch::nn::functional::linear(xb, w2, b2);
    EXPECT_TRUE(Close(ours, theirs)) << in;
    torch::Tensor g = torch::randn(ours.sizes());
    ours.backward(g);
    theirs.backward(g);
    EXPECT_TRUE(Close(xa.grad(), xb.grad())) << in;
    EXPECT_TRUE(Close(w.grad(), w2.grad())) << in;
    EXPECT_TRUE(Close(b.grad(), b2.grad())) << in;
  }
  EXPECT_THROW(kernels::Linear(torch::randn({2, 5}), torch::randn({3, 4}), torch::randn({3})), c10::Error);
}
#endif

}  // namespace
}  // namespace trainctl::kernels
