// Unit tests of the trainer's LibTorch parts: model shapes, the optimizers against PyTorch's own
// (torch::optim), and the gradient reducer against plain backward, on one rank and on two.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <array>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "common/cpus.h"
#include "models/models.h"
#include "jobspec/job_spec.h"
#include "models/ops.h"
#if TRAINCTL_HAVE_ONEDNN
#include "models/onednn.h"
#endif
#include "store/memory/memory_store.h"
#include "train/optimizer.h"
#include "train/reducer.h"
#include "train/schedule.h"
#include "train/torch_data.h"
#include "tests/test_util.h"

namespace trainctl::train {
namespace {

int64_t Count(const std::shared_ptr<models::Classifier>& m) {
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}

TEST(Models, ResNetsHaveTorchvisionsShapes) {
  // torchvision's resnet18 and resnet50 with 1000 classes: 11,689,512 and 25,557,032 parameters.
  auto r18 = models::MakeModel("resnet18", {3, 32, 32, 1000});
  ASSERT_TRUE(r18.ok());
  EXPECT_EQ(Count(*r18), 11689512);
  auto r50 = models::MakeModel("resnet50", {3, 32, 32, 1000});
  ASSERT_TRUE(r50.ok());
  EXPECT_EQ(Count(*r50), 25557032);
  auto params = (*r50)->named_parameters();
  EXPECT_TRUE(params.contains("layer4.2.conv3.weight"));
  EXPECT_TRUE(params.contains("layer1.0.downsample.1.weight"));
  EXPECT_TRUE((*r50)->named_buffers().contains("bn1.running_mean"));
  auto out = (*r18)->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{2, 1000}));
}

// cnn, resnet18 and resnet50 are declarations of layers (BuiltinLayers, jobspec/layers.h) built as a spec's
// declared model is, with the parameters, names and initial weights the classes they replaced
// had: checkpoints and exported models of earlier runs load as they did.
TEST(Models, TheBuiltinCnnIsADeclarationWithItsFormerWeightsAndComputation) {
  namespace F = torch::nn::functional;
  torch::manual_seed(7);
  auto model = models::MakeModel("cnn", {1, 28, 28, 10});
  ASSERT_TRUE(model.ok());
  // The former class made its modules in this order, each drawing its default initialization.
  torch::manual_seed(7);
  torch::nn::Conv2d conv1(torch::nn::Conv2dOptions(1, 32, 3).padding(1)), conv2(torch::nn::Conv2dOptions(32, 64, 3).padding(1));
  torch::nn::Linear fc1(64 * 7 * 7, 128), fc2(128, 10);
  const std::map<std::string, torch::Tensor> former = {
      {"conv1.weight", conv1->weight}, {"conv1.bias", conv1->bias}, {"conv2.weight", conv2->weight},
      {"conv2.bias", conv2->bias},     {"fc1.weight", fc1->weight},   {"fc1.bias", fc1->bias},
      {"fc2.weight", fc2->weight},     {"fc2.bias", fc2->bias}};
  auto params = (*model)->named_parameters();
  ASSERT_EQ(params.size(), former.size());
  for (const auto& [name, value] : former) {
    ASSERT_TRUE(params.contains(name)) << name;
    EXPECT_TRUE(torch::equal(params[name], value)) << name;
  }
  // The computation: conv, max-pool 2, ReLU twice, then fc1, ReLU, fc2 (the model's own kernels
  // round the Winograd products differently from ATen's in the last digits).
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({4, 1, 28, 28});
  torch::Tensor ref = torch::relu(F::max_pool2d(conv1(x), F::MaxPool2dFuncOptions(2)));
  ref = torch::relu(F::max_pool2d(conv2(ref), F::MaxPool2dFuncOptions(2)));
  ref = fc2(torch::relu(fc1(ref.flatten(1))));
  const torch::Tensor out = (*model)->forward(x);
  EXPECT_TRUE(torch::allclose(out, ref, 1e-4, 1e-4)) << (out - ref).abs().max().item<float>();
}

TEST(Models, TheBuiltinResNetsAreDeclarationsWithTorchvisionsInitialization) {
  auto layers = BuiltinLayers("resnet50");
  ASSERT_TRUE(layers.has_value());
  auto summary = SummarizeModel(*layers, {3, 224, 224}, 1000);  // torchvision's shapes check
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->params, 25557032);
  EXPECT_EQ(summary->rows.back().shape, std::vector<int64_t>{1000});
  torch::manual_seed(1);
  auto r18 = models::MakeModel("resnet18", {3, 32, 32, 10});
  ASSERT_TRUE(r18.ok());
  auto params = (*r18)->named_parameters();
  // Kaiming normal, fan out, for ReLU: std sqrt(2 / (64 x 3 x 3)) for layer1's convolutions.
  const torch::Tensor w = params["layer1.0.conv1.weight"];
  EXPECT_NEAR(w.std().item<double>(), std::sqrt(2.0 / (64 * 9)), 0.1 * std::sqrt(2.0 / (64 * 9)));
  EXPECT_TRUE(torch::equal(params["bn1.weight"], torch::ones({64})));
  EXPECT_TRUE(params.contains("layer2.0.downsample.0.weight"));
  EXPECT_FALSE(params.contains("layer1.0.downsample.0.weight"));  // layer1 keeps the shape
  // The residual: relu(body(x) + downsample(x)) where the shape changes.
  torch::NoGradGuard no_grad;
  (*r18)->eval();
  auto out = (*r18)->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(out.sizes().vec(), (std::vector<int64_t>{2, 10}));
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

TEST(Ops, BlockedLayoutRoundTrips) {
  torch::Tensor x = torch::randn({2, 32, 5, 6});
  torch::Tensor b = models::ToBlocked(x);
  EXPECT_EQ(b.sizes().vec(), (std::vector<int64_t>{2, 2, 5, 6, 16}));
  EXPECT_EQ(b[1][1][4][3][7].item<float>(), x[1][16 + 7][4][3].item<float>());  // channel 23
  EXPECT_TRUE(torch::equal(models::FromBlocked(b), x));
  // Channels-last in memory, as the first layer leaves it: the same blocked tensor.
  EXPECT_TRUE(torch::equal(models::ToBlocked(x.contiguous(at::MemoryFormat::ChannelsLast)), b));
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
      return blocked ? models::FromBlocked(models::MaxPool2x2Relu(models::ToBlocked(x), relu))
                     : models::MaxPool2x2Relu(x, relu);
    };
    const auto aten = [relu](const torch::Tensor& x) {
      return relu ? torch::relu(torch::max_pool2d(x, 2)) : torch::max_pool2d(x, 2);
    };
    for (bool blocked : {true, false}) {
      // Small integers, negatives included, make many ties inside windows and many windows that
      // the ReLU zeroes: the gradient must go where ATen sends it.
      for (auto shape : {std::vector<int64_t>{3, 16, 8, 6}, {2, 32, 28, 28}, {2, 64, 14, 14}, {1, 16, 4, 34},
                         {2, 16, 6, 2}, {1, 16, 2, 32}}) {
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
  EXPECT_THROW(models::MaxPool2x2Relu(torch::randn({16, 8, 40})), c10::Error);      // neither layout
  EXPECT_THROW(models::MaxPool2x2Relu(torch::randn({1, 16, 8, 5})), c10::Error);    // odd width
  EXPECT_THROW(models::MaxPool2x2Relu(torch::randn({1, 16, 8, 8}, torch::kFloat64)), c10::Error);
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
        ExpectConvPoolMatchesAten(models::ImageConvPoolRelu, shape, /*input_grad=*/false, ties, 1e-4f, relu);
      }
    }
  }
  torch::Tensor x = torch::randn({2, 1, 8, 8});
  EXPECT_THROW(models::ImageConvPoolRelu(x.requires_grad_(true), torch::randn({16, 1, 3, 3}), torch::randn({16})),
               c10::Error);  // no gradient for the input
  EXPECT_THROW(models::ImageConvPoolRelu(torch::randn({2, 1, 8, 8}), torch::randn({16, 2, 3, 3}), torch::randn({16})),
               c10::Error);  // channels differ
  EXPECT_THROW(models::ImageConvPoolRelu(torch::randn({2, 1, 8, 7}), torch::randn({16, 1, 3, 3}), torch::randn({16})),
               c10::Error);  // odd width
  EXPECT_THROW(models::ImageConvPoolRelu(torch::randn({2, 1, 8, 8}), torch::randn({8, 1, 3, 3}), torch::randn({8})),
               c10::Error);  // 8 output channels
}

// The hidden layer by Winograd: the CNN's 32 -> 64, and shapes whose tiles are not a multiple of
// the kernel's 6 rows, with several images for LibTorch's threads and more than one group of the
// weight gradient's sum; 6 x 10 then 10 x 6, planes of one size and another shape in the same
// threads' scratch buffers. On a CPU without AVX2 and FMA it is ATen's own.
TEST(Ops, ConvPoolReluMatchesAtens) {
  if (!models::WinogradConvolutions()) {
    GTEST_LOG_(INFO) << "no AVX2 and FMA here: ATen's convolution is compared with itself";
  }
  torch::manual_seed(5);
  for (auto shape : {std::array<int64_t, 5>{9, 32, 64, 14, 14}, {3, 16, 32, 6, 10}, {3, 16, 32, 10, 6},
                     {2, 48, 16, 2, 2}, {1, 16, 16, 16, 4}}) {
    for (bool ties : {false, true}) {
      for (bool relu : {true, false}) {
        ExpectConvPoolMatchesAten(models::ConvPoolRelu, shape, /*input_grad=*/true, ties, 1e-5f, relu);
      }
    }
  }
  // An empty batch: an empty output, zero gradients.
  torch::Tensor w0 = torch::randn({16, 16, 3, 3}).requires_grad_(true), b0 = torch::randn({16}).requires_grad_(true);
  torch::Tensor y0 = models::ConvPoolRelu(torch::randn({0, 16, 4, 4}), w0, b0);
  EXPECT_EQ(y0.sizes(), torch::IntArrayRef({0, 16, 2, 2}));
  y0.sum().backward();
  EXPECT_TRUE(w0.grad().eq(0).all().item<bool>());
  EXPECT_TRUE(b0.grad().eq(0).all().item<bool>());
  EXPECT_THROW(models::ConvPoolRelu(torch::randn({2, 8, 8, 8}), torch::randn({16, 8, 3, 3}), torch::randn({16})),
               c10::Error);  // 8 channels
  EXPECT_THROW(models::ConvPoolRelu(torch::randn({2, 16, 7, 8}), torch::randn({16, 16, 3, 3}), torch::randn({16})),
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
        torch::Tensor ours = models::BatchNormRelu(x1, w1, b1, m1, v1, 0.1, 1e-5, relu);
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
  torch::Tensor one = models::BatchNormRelu(x, w, b, {}, {}, 0, 1e-5, true);
  at::set_num_threads(2);
  torch::Tensor two = models::BatchNormRelu(x, w, b, {}, {}, 0, 1e-5, true);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, two));
  EXPECT_THROW(models::BatchNormRelu(torch::randn({1, 16, 1, 1}), w, b, {}, {}, 0.1, 1e-5, true), c10::Error);
  EXPECT_THROW(models::BatchNormRelu(torch::randn({2, 8, 3, 3}), w, b, {}, {}, 0.1, 1e-5, true), c10::Error);
}

// The hidden layer's matrix products on AVX-512 are the same chains of FMAs as on AVX2: the
// output and every gradient the same bits, for the CNN's shape and one of a last 16 columns.
TEST(Ops, TheAvx512KernelsGiveTheSameBitsAsAvx2) {
  if (!models::WinogradConvolutions() || !CpuHasAvx512()) GTEST_SKIP() << "needs a CPU with AVX-512";
  torch::manual_seed(8);
  for (auto shape : {std::array<int64_t, 4>{5, 32, 64, 14}, {3, 48, 48, 6}}) {
    const auto [n, in, out, size] = shape;
    torch::Tensor x = torch::randn({n, in, size, size}).contiguous(at::MemoryFormat::ChannelsLast);
    torch::Tensor w = torch::randn({out, in, 3, 3}) * 0.1, b = torch::randn({out});
    torch::Tensor g = torch::randn({n, out, size / 2, size / 2});
    std::vector<torch::Tensor> results[2];
    for (bool wide : {true, false}) {
      models::AllowAvx512Products(wide);
      torch::Tensor xs = x.clone().requires_grad_(true), ws = w.clone().requires_grad_(true),
                    bs = b.clone().requires_grad_(true);
      torch::Tensor y = models::ConvPoolRelu(xs, ws, bs);
      y.backward(g);
      results[wide] = {y, xs.grad(), ws.grad(), bs.grad()};
    }
    models::AllowAvx512Products(true);
    for (int k = 0; k < 4; ++k) EXPECT_TRUE(torch::equal(results[0][k], results[1][k])) << "result " << k << " of " << in;
  }
  // The first layer too (16 output channels a register), with and without its ReLU.
  for (auto [n, c, out] : {std::array<int64_t, 3>{5, 1, 16}, {3, 3, 32}}) {
    for (bool relu : {true, false}) {
      torch::Tensor x = torch::randn({n, c, 12, 10});
      torch::Tensor w = torch::randn({out, c, 3, 3}) * 0.3, b = torch::randn({out});
      torch::Tensor g = torch::randn({n, out, 6, 5});
      std::vector<torch::Tensor> results[2];
      for (bool wide : {true, false}) {
        models::AllowAvx512Products(wide);
        torch::Tensor ws = w.clone().requires_grad_(true), bs = b.clone().requires_grad_(true);
        torch::Tensor y = models::ImageConvPoolRelu(x, ws, bs, relu);
        y.backward(g);
        results[wide] = {y, ws.grad(), bs.grad()};
      }
      models::AllowAvx512Products(true);
      for (int k = 0; k < 3; ++k) {
        EXPECT_TRUE(torch::equal(results[0][k], results[1][k])) << "image layer result " << k << " of " << c << " relu " << relu;
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
        models::AllowAvx512Products(wide);
        torch::Tensor xs = x.clone().requires_grad_(true), ws = w.clone().requires_grad_(true),
                      bs = b.clone().requires_grad_(true);
        torch::Tensor mean = torch::zeros({c}), var = torch::ones({c});
        torch::Tensor y = models::BatchNormRelu(xs, ws, bs, mean, var, 0.1, 1e-5, relu);
        y.backward(g);
        results[wide] = {y, xs.grad(), ws.grad(), bs.grad(), mean, var};
      }
      models::AllowAvx512Products(true);
      for (int k = 0; k < 6; ++k) {
        EXPECT_TRUE(torch::equal(results[0][k], results[1][k])) << "batch norm result " << k << " of " << c << " relu " << relu;
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
  if (!models::BlockedConvolutions()) GTEST_SKIP() << "oneDNN has no blocked kernels on this CPU (AVX-512's)";
  torch::manual_seed(11);
  // The batch of 64: oneDNN takes Winograd for the 32-channel shape at that size on AVX-512.
  for (auto [batch, in, out, side] : {std::array<int64_t, 4>{64, 32, 64, 14}, {5, 32, 64, 14}, {3, 16, 32, 8}}) {
    torch::Tensor x = torch::randn({batch, in, side, side});
    torch::Tensor w = (torch::randn({out, in, 3, 3}) * 0.2).requires_grad_(true);
    torch::Tensor bias = torch::randn({out}).requires_grad_(true);
    torch::Tensor w2 = w.detach().clone().requires_grad_(true), bias2 = bias.detach().clone().requires_grad_(true);
    torch::Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    torch::Tensor ours = models::FromBlocked(models::Conv3x3(models::ToBlocked(xa), w, bias));
    torch::Tensor theirs = torch::conv2d(xb, w2, bias2, 1, 1);
    EXPECT_TRUE(Close(ours, theirs)) << in << " -> " << out;
    torch::Tensor g = torch::randn(ours.sizes());
    ours.backward(g);
    theirs.backward(g);
    EXPECT_TRUE(Close(w.grad(), w2.grad())) << in;
    EXPECT_TRUE(Close(bias.grad(), bias2.grad())) << in;
    EXPECT_TRUE(Close(xa.grad(), xb.grad())) << in;
    // The same inputs give the same bits.
    torch::Tensor again = models::FromBlocked(models::Conv3x3(models::ToBlocked(x), w, bias));
    EXPECT_TRUE(torch::equal(again, ours.detach()));
  }
  EXPECT_THROW(models::Conv3x3(torch::randn({2, 32, 8, 8}), torch::randn({16, 32, 3, 3}), torch::randn({16})),
               c10::Error);  // 32 channels, not blocked
  EXPECT_THROW(models::Conv3x3(torch::randn({2, 1, 8, 8}), torch::randn({16, 1, 3, 3}), torch::randn({16})),
               c10::Error);  // an image's channels: the first layer is models::ImageConvPoolRelu
  EXPECT_THROW(models::Conv3x3(models::ToBlocked(torch::randn({2, 16, 8, 8})), torch::randn({16, 16, 5, 5}),
                               torch::randn({16})),
               c10::Error);  // not 3x3
}

// In bf16 the convolution multiplies x, the weight and the output's gradient rounded to bf16 and
// sums in f32: equal, to f32 rounding, to ATen's f32 convolution of the rounded values (a product
// of two bf16 is exact in f32), forward and backward; and far from the f32 result on unrounded
// values, so the test sees that bf16 was used.
TEST(OneDnn, Conv3x3InBf16IsTheF32ConvolutionOfBf16RoundedValues) {
  if (!models::Bf16Convolutions()) GTEST_SKIP() << "this CPU has no bf16 instructions";
  torch::manual_seed(12);
  auto round = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat32); };
  for (int64_t batch : {64, 5}) {
    torch::Tensor x = torch::randn({batch, 32, 14, 14});
    torch::Tensor w = (torch::randn({64, 32, 3, 3}) * 0.2).requires_grad_(true);
    torch::Tensor bias = torch::randn({64}).requires_grad_(true);
    torch::Tensor xa = x.clone().requires_grad_(true);
    torch::Tensor ours = models::FromBlocked(models::Conv3x3(models::ToBlocked(xa), w, bias, /*bf16=*/true));
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
      torch::Tensor ours = models::Convolution(xa, w, bias, c.stride, c.padding, /*bf16=*/false);
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
      EXPECT_TRUE(torch::equal(models::Convolution(x, w, bias, c.stride, c.padding, false), ours));
    }
  }
  EXPECT_THROW(models::Convolution(torch::randn({2, 8, 8, 8}), torch::randn({16, 4, 3, 3}), {}, 1, 1, false),
               c10::Error);  // the weight's channels are not the input's
  EXPECT_THROW(models::Convolution(torch::randn({2, 8, 2, 2}), torch::randn({16, 8, 5, 5}), {}, 1, 0, false),
               c10::Error);  // the window does not fit
  if (!models::Bf16Convolutions()) return;
  auto round = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat32); };
  for (bool bf16_input : {false, true}) {
    torch::Tensor x = torch::randn({8, 16, 14, 14}).contiguous(at::MemoryFormat::ChannelsLast);
    if (bf16_input) x = x.to(torch::kBFloat16);
    torch::Tensor w = (torch::randn({48, 16, 3, 3}) * 0.2).requires_grad_(true);
    torch::Tensor bias = torch::randn({48}).requires_grad_(true);
    torch::Tensor xa = x.clone().requires_grad_(true);
    torch::Tensor ours = models::Convolution(xa, w, bias, 2, 1, /*bf16=*/true);
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
    torch::Tensor ours = models::Linear(xa, w, b), theirs = torch::nn::functional::linear(xb, w2, b2);
    EXPECT_TRUE(Close(ours, theirs)) << in;
    torch::Tensor g = torch::randn(ours.sizes());
    ours.backward(g);
    theirs.backward(g);
    EXPECT_TRUE(Close(xa.grad(), xb.grad())) << in;
    EXPECT_TRUE(Close(w.grad(), w2.grad())) << in;
    EXPECT_TRUE(Close(b.grad(), b2.grad())) << in;
  }
  EXPECT_THROW(models::Linear(torch::randn({2, 5}), torch::randn({3, 4}), torch::randn({3})), c10::Error);
}
#endif

TEST(Models, CnnTakes28And32PixelImagesAndRejectsOthers) {
  for (int side : {28, 32}) {
    auto m = models::MakeModel("cnn", {side == 28 ? 1 : 3, side, side, 10});
    ASSERT_TRUE(m.ok());
    EXPECT_EQ((*m)->forward(torch::randn({4, side == 28 ? 1 : 3, side, side})).sizes().vec(),
              (std::vector<int64_t>{4, 10}));
  }
  EXPECT_EQ(models::MakeModel("cnn", {1, 30, 30, 10}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(models::MakeModel("vgg", {1, 28, 28, 10}).status().code(), Code::kInvalidArgument);
}

// Runs our optimizer and torch::optim's on the same parameters and gradients.
void CompareWithTorch(const OptimizerSpec& spec, std::unique_ptr<torch::optim::Optimizer> (*make)(
                                                     std::vector<torch::Tensor>, const OptimizerSpec&),
                      int64_t size = 1000, bool bitwise = false) {
  torch::manual_seed(1);
  torch::Tensor ours = torch::randn({size});
  torch::Tensor theirs = ours.clone().requires_grad_(true);
  torch::Tensor grads = torch::zeros({size});
  Optimizer opt(spec, ours, grads);
  auto ref = make({theirs}, spec);
  for (int step = 0; step < 5; ++step) {
    torch::Tensor g = torch::randn({size});
    grads.copy_(g);
    theirs.mutable_grad() = g.clone();
    opt.Step(spec.lr);
    ref->step();
  }
  EXPECT_TRUE(torch::allclose(ours, theirs.detach(), 1e-6, 1e-6))
      << (ours - theirs.detach()).abs().max().item<float>();
  if (bitwise) {
    EXPECT_TRUE(torch::equal(ours, theirs.detach())) << (ours - theirs.detach()).abs().max().item<float>();
  }
}

// The declared model's layers computed again with ATen's functional operations alone, on the
// model's own parameters by name: the reference its fused kernels are held to.
torch::Tensor Reference(const std::vector<LayerSpec>& layers, torch::Tensor x, torch::nn::Module& m, int classes) {
  namespace F = torch::nn::functional;
  auto params = m.named_parameters();
  auto buffers = m.named_buffers();
  auto p = [&](const std::string& name) { return params.contains(name) ? params[name] : torch::Tensor(); };
  for (const LayerSpec& in : layers) {
    const LayerSpec l = WithDefaults(in);
    using K = LayerSpec::Kind;
    switch (l.kind) {
      case K::kConv:
        x = torch::conv2d(x, p(l.name + ".weight"), p(l.name + ".bias"), l.stride, l.padding, 1, l.groups);
        break;
      case K::kBatchNorm:
        x = torch::batch_norm(x, p(l.name + ".weight"), p(l.name + ".bias"), buffers[l.name + ".running_mean"].clone(),
                              buffers[l.name + ".running_var"].clone(), true, 0.1, 1e-5, false);
        break;
      case K::kRelu: x = torch::relu(x); break;
      case K::kGelu: x = torch::gelu(x); break;
      case K::kMaxPool: x = torch::max_pool2d(x, l.kernel, l.stride, l.padding); break;
      case K::kAvgPool: x = torch::avg_pool2d(x, l.kernel, l.stride, l.padding); break;
      case K::kGlobalAvgPool: x = torch::adaptive_avg_pool2d(x, {1, 1}); break;
      case K::kFlatten: x = x.flatten(1); break;
      case K::kLinear: x = torch::linear(x, p(l.name + ".weight"), p(l.name + ".bias")); break;
      case K::kDropout: break;  // p: 0 in these tests
      case K::kResidual: {
        torch::Tensor y = Reference(l.body, x, m, classes);
        if (params.contains(l.name + ".downsample.0.weight")) {
          int64_t stride = 1;  // the 1x1 convolution's stride that takes x's size to y's
          while ((x.size(2) - 1) / stride + 1 != y.size(2) || (x.size(3) - 1) / stride + 1 != y.size(3)) ++stride;
          torch::Tensor sc = torch::conv2d(x, p(l.name + ".downsample.0.weight"), {}, stride);
          const std::string bn = l.name + ".downsample.1";
          sc = torch::batch_norm(sc, p(bn + ".weight"), p(bn + ".bias"), buffers[bn + ".running_mean"].clone(),
                                 buffers[bn + ".running_var"].clone(), true, 0.1, 1e-5, false);
          x = y + sc;
        } else {
          x = y + x;
        }
        break;
      }
    }
  }
  return x;
}

std::vector<LayerSpec> ParseLayers(const std::string& json) {
  auto layers = LayersFromJson(json, "test");
  EXPECT_TRUE(layers.ok()) << layers.status().message();
  return layers.ok() ? *layers : std::vector<LayerSpec>{};
}

// Declared models against ATen's operations on random shapes: the fused convolution, pooling and
// ReLU kernels where they serve (16-channel multiples, 3x3, even sizes), ATen elsewhere; the
// outputs and every parameter's gradient agree to rounding, in training mode (batch norm on the
// batch's statistics).
TEST(Models, DeclaredLayersMatchAtensOperationsForwardAndBackward) {
  torch::manual_seed(11);
  const std::vector<std::pair<std::string, std::array<int64_t, 4>>> cases = {
      // The recipe's CNN: conv+maxpool fused on the image (batch norm before the relu), then
      // strided convolutions through oneDNN, channels-last.
      {R"([{"conv": {"channels": 16, "padding": 1}}, {"maxpool": 2}, "batchnorm", "relu",
          {"conv": {"channels": 48, "stride": 2, "padding": 1}}, "batchnorm", "relu", "flatten", "linear"])",
       {8, 1, 28, 28}},
      // The example CNN's order (conv, pool, relu twice): both layers fused, the second by Winograd.
      {R"([{"conv": {"channels": 16, "padding": 1}}, {"maxpool": 2}, "relu", {"conv": {"channels": 32, "padding": 1}},
          "relu", {"maxpool": 2}, "flatten", {"linear": 24}, "gelu", "linear"])",
       {3, 3, 12, 20}},
      // Odd sizes, groups, average pooling, a residual block with a projection, batch norm on features.
      {R"([{"conv": {"channels": 12, "kernel": 5, "padding": 2, "groups": 3}}, {"maxpool": 2}, "relu",
          {"residual": [{"conv": {"channels": 24, "stride": 2, "padding": 1, "bias": false}}, "batchnorm"]},
          {"avgpool": {"kernel": 3, "stride": 1, "padding": 1}}, "global_avgpool", "flatten", {"linear": 16},
          "batchnorm", "relu", "linear"])",
       {4, 3, 15, 17}},
  };
  for (const auto& [json, shape] : cases) {
    SCOPED_TRACE(json);
    const std::vector<LayerSpec> layers = ParseLayers(json);
    ASSERT_FALSE(layers.empty());
    const int classes = 7;
    auto model = models::MakeModel("layers", {int(shape[1]), int(shape[2]), int(shape[3]), classes}, layers);
    ASSERT_TRUE(model.ok()) << model.status().message();
    (*model)->train();
    torch::Tensor x = torch::randn({shape[0], shape[1], shape[2], shape[3]});
    torch::Tensor out = (*model)->forward(x);
    ASSERT_EQ(out.sizes().vec(), (std::vector<int64_t>{shape[0], classes}));
    torch::Tensor g = torch::randn_like(out);
    out.backward(g);
    std::map<std::string, torch::Tensor> grads;
    for (const auto& p : (*model)->named_parameters()) grads[p.key()] = p.value().grad().clone();
    (*model)->zero_grad();
    torch::Tensor ref = Reference(layers, x, **model, classes);
    ref.backward(g);
    EXPECT_TRUE(torch::allclose(out, ref, 1e-4, 1e-4)) << (out - ref).abs().max().item<float>();
    for (const auto& p : (*model)->named_parameters()) {
      const torch::Tensor& want = p.value().grad();
      EXPECT_TRUE(torch::allclose(grads[p.key()], want, 1e-3, 1e-4))
          << p.key() << ": " << (grads[p.key()] - want).abs().max().item<float>();
    }
  }
}

// Parameter names are PyTorch's: a declared model's state loads into torch.nn modules of the same
// names, and a residual block named as torchvision names its blocks holds torchvision's names.
TEST(Models, DeclaredLayersAreNamedAsInPyTorch) {
  const auto layers = ParseLayers(R"([{"conv": {"channels": 16, "padding": 1, "bias": false}}, "batchnorm", "relu",
      {"residual": {"name": "layer1.0", "layers": [{"conv": {"channels": 32, "stride": 2, "padding": 1,
        "bias": false}}, "batchnorm"]}}, "global_avgpool", "flatten", {"linear": {"name": "fc"}}])");
  auto model = models::MakeModel("layers", {3, 8, 8, 10}, layers);
  ASSERT_TRUE(model.ok()) << model.status().message();
  std::vector<std::string> names;
  for (const auto& p : (*model)->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight",
                                             "layer1.0.bn1.weight", "layer1.0.bn1.bias",
                                             "layer1.0.downsample.0.weight", "layer1.0.downsample.1.weight",
                                             "layer1.0.downsample.1.bias", "fc.weight", "fc.bias"}));
  EXPECT_TRUE((*model)->named_buffers().contains("layer1.0.bn1.running_mean"));
  // A shape the declaration cannot take is an error, before any module is made.
  auto wrong = models::MakeModel("layers", {3, 1, 1, 10}, ParseLayers(R"([{"conv": 16}, "flatten", "linear"])"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("trainer.model.layers[0] (conv)"), std::string::npos)
      << wrong.status().message();
}

// A model scripted by Debian's PyTorch (tests/python/scripted_models.py: a batch-norm CNN and a
// small ResNet): its parameters and buffers under PyTorch's names, in its order, and on the same
// batch in training mode the same loss and gradients as PyTorch computed.
TEST(Models, ATorchScriptModuleTrainsAsPyTorchComputesIt) {
  testing::Scratch s;
  auto made = testing::RunProgram({TRAINCTL_TEST_PYTHON, std::string(TRAINCTL_SOURCE_DIR) + "/tests/python/scripted_models.py",
                                   s.path("models")}, s.path(""));
  ASSERT_EQ(made.exit.code, 0) << made.output;
  torch::Tensor x = torch::linspace(-1, 1, 8 * 28 * 28).reshape({8, 1, 28, 28});
  torch::Tensor y = torch::arange(8, torch::kLong) % 10;
  for (const char* name : {"bn_cnn", "resnet"}) {
    SCOPED_TRACE(name);
    const auto want = nlohmann::json::parse(s.Read(std::string("models/") + name + ".json"));
    auto file = checkpoint::ReadModuleFile(s.path(std::string("models/") + name + ".pt"));
    ASSERT_TRUE(file.ok()) << file.status().message();
    auto model = models::MakeModel("torchscript", {1, 28, 28, 10}, {}, &*file);
    ASSERT_TRUE(model.ok()) << model.status().message();
    std::vector<std::string> names, buffers;
    for (const auto& p : (*model)->named_parameters()) names.push_back(p.key());
    for (const auto& b : (*model)->named_buffers()) buffers.push_back(b.key());
    EXPECT_EQ(names, want["names"].get<std::vector<std::string>>());
    EXPECT_EQ(buffers, want["buffers"].get<std::vector<std::string>>());
    (*model)->train();
    torch::Tensor loss = torch::nn::functional::cross_entropy((*model)->forward(x), y);
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), want["loss"].get<double>(), 1e-5);
    size_t i = 0;
    for (const auto& p : (*model)->named_parameters()) {
      const double sum = p.value().grad().to(torch::kDouble).sum().item<double>();
      EXPECT_NEAR(sum, want["grad_sums"][i].get<double>(), 1e-4 + 1e-4 * std::abs(sum)) << p.key();
      ++i;
    }
  }
  // The wrong file, or a module that does not fit the data, is an error naming the file and,
  // from the TorchScript interpreter, its cause (not only that "an operation failed").
  auto module = [&](const std::string& name) { return checkpoint::ReadModuleFile(s.path(name)).value(); };
  auto pickled = testing::RunProgram(
      {TRAINCTL_TEST_PYTHON, "-c",
       "import sys, torch\ntorch.save(torch.nn.Linear(4, 2), sys.argv[1] + '/pickled.pt')\n"
       "torch.save(torch.nn.Linear(4, 2).state_dict(), sys.argv[1] + '/state.pt')\n",
       s.path("models")}, s.path(""));
  ASSERT_EQ(pickled.exit.code, 0) << pickled.output;
  for (const char* name : {"models/pickled.pt", "models/state.pt"}) {
    const auto m = module(name);
    auto bad = models::MakeModel("torchscript", {1, 28, 28, 10}, {}, &m);
    ASSERT_FALSE(bad.ok()) << name;
    EXPECT_NE(bad.status().message().find(std::string(name) + ": not a TorchScript module LibTorch can load (save it with "
                                          "torch.jit.script(model).save(path), not torch.save)"),
              std::string::npos) << bad.status().message();
  }
  const auto bn_cnn = module("models/bn_cnn.pt");
  auto classes = models::MakeModel("torchscript", {1, 28, 28, 7}, {}, &bn_cnn);
  ASSERT_FALSE(classes.ok());
  EXPECT_NE(classes.status().message().find("expected [2, 7], one score per class"), std::string::npos)
      << classes.status().message();
  auto shape = models::MakeModel("torchscript", {3, 32, 32, 10}, {}, &bn_cnn);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("cannot take a batch of 3x32x32 images: "), std::string::npos)
      << shape.status().message();
  EXPECT_NE(shape.status().message().find("to have 1 channels, but got 3 channels instead"), std::string::npos)
      << shape.status().message();
}

// trainer.data.augment: each image shifted by at most crop_padding pixels (black coming in) and
// mirrored half the time, the same for the same (seed, epoch, image), other in another epoch.
TEST(Data, AugmentationShiftsAndMirrorsEachImageAsItsHashSays) {
  data::ImageSet set;
  set.count = 64, set.channels = 1, set.rows = 6, set.cols = 5, set.num_classes = 2;
  for (int64_t i = 0; i < set.count; ++i) {
    for (int k = 0; k < 30; ++k) set.pixels.push_back(static_cast<uint8_t>(1 + (i * 30 + k) % 250));
    set.labels.push_back(static_cast<uint8_t>(i % 2));
  }
  const Normalizer norm{{0.0f}, {1.0f / 255.0f}};  // the batch's values are the pixels themselves
  std::vector<int64_t> idx(64);
  for (int64_t i = 0; i < 64; ++i) idx[i] = i;
  Augment a{2, true, 7, 0};
  torch::Tensor x, y, x2, y2, x3, y3;
  FillBatch(set, idx.data(), 64, norm, &x, &y, &a);
  FillBatch(set, idx.data(), 64, norm, &x2, &y2, &a);
  EXPECT_TRUE(torch::equal(x, x2));
  a.epoch = 1;
  FillBatch(set, idx.data(), 64, norm, &x3, &y3, &a);
  EXPECT_FALSE(torch::equal(x, x3));
  int flipped = 0;
  std::set<std::pair<int, int>> shifts;
  for (int64_t i = 0; i < 64; ++i) {
    const uint8_t* src = set.image(i);
    bool found = false;
    for (int flip = 0; flip < 2 && !found; ++flip) {
      for (int dy = -2; dy <= 2 && !found; ++dy) {
        for (int dx = -2; dx <= 2 && !found; ++dx) {
          bool same = true;
          for (int r = 0; r < 6 && same; ++r) {
            for (int c = 0; c < 5 && same; ++c) {
              const int sr = r + dy, sc = (flip ? 4 - c : c) + dx;
              const float want = (sr >= 0 && sr < 6 && sc >= 0 && sc < 5) ? src[sr * 5 + sc] : 0;
              same = std::abs(x[i][0][r][c].item<float>() - want) < 1e-3f;
            }
          }
          if (same) {
            found = true;
            flipped += flip;
            shifts.insert({dy, dx});
          }
        }
      }
    }
    EXPECT_TRUE(found) << "image " << i << " is no shift or mirror of its source";
    EXPECT_EQ(y[i].item<int64_t>(), set.labels[i]);
  }
  EXPECT_GT(flipped, 16);
  EXPECT_LT(flipped, 48);
  EXPECT_GT(shifts.size(), 12u);  // of the 25
  // Off: the images as they are.
  Augment off;
  FillBatch(set, idx.data(), 64, norm, &x2, &y2, &off);
  EXPECT_NEAR(x2[3][0][1][2].item<float>(), set.image(3)[1 * 5 + 2], 1e-3f);
}

TEST(Optimizer, SgdMatchesTorch) {
  OptimizerSpec s;
  s.lr = 0.1;
  s.momentum = 0.9;
  s.weight_decay = 1e-3;
  auto sgd = [](std::vector<torch::Tensor> p, const OptimizerSpec& s) {
    return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::SGD(
        p, torch::optim::SGDOptions(s.lr).momentum(s.momentum).weight_decay(s.weight_decay).nesterov(s.nesterov)));
  };
  for (bool nesterov : {false, true}) {
    s.nesterov = nesterov;
    CompareWithTorch(s, sgd);
    // Where ATen's vectorized loops cover every element (16 floats a turn), the same bits: the
    // one-pass update rounds as ATen's five operations do.
    CompareWithTorch(s, sgd, 4096, /*bitwise=*/true);
  }
}

TEST(Optimizer, AdamMatchesTorch) {
  OptimizerSpec s;
  s.name = "adam";
  s.lr = 0.01;
  s.weight_decay = 1e-2;
  CompareWithTorch(s, [](std::vector<torch::Tensor> p, const OptimizerSpec& s) {
    return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::Adam(
        p, torch::optim::AdamOptions(s.lr).betas({s.beta1, s.beta2}).eps(s.eps)
               .weight_decay(s.weight_decay)));
  });
}

// Trains two steps through the reducer and compares the gradients with plain backward on a
// copy of the model, on `device`; with `channels_last`, the reducer's 4-D parameters are so.
void ExpectReducedGradientsEqualPlainBackward(comm::Communicator* comm, torch::Device device,
                                             bool bitwise, bool channels_last = false) {
  torch::manual_seed(3);
  auto model = *models::MakeModel("cnn", {1, 28, 28, 10});
  auto reference = *models::MakeModel("cnn", {1, 28, 28, 10});
  model->to(device);
  reference->to(device);
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    torch::NoGradGuard g;
    torch::Tensor p = reference->parameters()[i];
    p.copy_(model->parameters()[i]);
    // The same layout on both sides: the same kernels (other kernels round otherwise).
    if (channels_last && p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  // Small buckets: several of them, each reduced as soon as its gradients are in.
  GradientReducer reducer(model->parameters(), comm, 64 << 10, channels_last);
  EXPECT_GT(reducer.bucket_count(), 2u);
  EXPECT_EQ(reducer.flat_grads().device(), device);
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(p.is_contiguous(channels_last && p.dim() == 4 ? torch::MemoryFormat::ChannelsLast
                                                              : torch::MemoryFormat::Contiguous));
    // cuDNN's channels-last kernels need 16-byte aligned weights.
    if (device.is_cuda()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data_ptr()) % 64, 0u);
    }
  }
  torch::Tensor x = torch::randn({8, 1, 28, 28}).to(device);
  torch::Tensor y = torch::randint(0, 10, {8}).to(device);
  for (int step = 0; step < 2; ++step) {  // the second step checks that ZeroGrad re-arms
    reducer.ZeroGrad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    ASSERT_TRUE(reducer.Finish().ok());
  }
  reference->zero_grad();
  torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    const torch::Tensor& got = model->parameters()[i].grad();
    const torch::Tensor& want = reference->parameters()[i].grad();
    EXPECT_TRUE(bitwise ? torch::equal(got, want) : torch::allclose(got, want, 1e-5, 1e-6))
        << "parameter " << i << ": largest difference " << (got - want).abs().max().item<float>()
        << " of " << want.abs().max().item<float>();
  }
  // The parameters now live in the flat buffer.
  EXPECT_EQ(model->parameters()[0].data_ptr<float>() >= reducer.flat_params().data_ptr<float>(), true);
}

TEST(Reducer, FlatGradientsEqualPlainBackward) {
  MemoryStore store;
  auto comm = comm::ConnectGloo(store, {});
  ASSERT_TRUE(comm.ok());
  ExpectReducedGradientsEqualPlainBackward(comm->get(), torch::kCPU, /*bitwise=*/true);
}

// On a GPU, through NCCL: each bucket's sum is queued on the GPU behind its gradients (queued,
// not yet computed, when the hook fires), and the stream waits for the sums. Convolution kernels
// may differ from run to run in the last bits, so this compares with a tolerance.
TEST(Reducer, FlatGradientsEqualPlainBackwardOnTheGpu) {
  if (!torch::cuda::is_available() || !comm::NcclAvailable()) {
    GTEST_SKIP() << "needs a GPU and a trainctl built with CUDA and NCCL";
  }
  // No TF32 (cuDNN's default on Ampere and later, 10 bits of mantissa): the tolerance is for
  // float32's rounding.
  const bool tf32 = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuDNN(false);
  MemoryStore store;
  auto comm = comm::ConnectNccl(store, {});
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  ExpectReducedGradientsEqualPlainBackward(comm->get(), torch::Device(torch::kCUDA, 0), /*bitwise=*/false);
  ExpectReducedGradientsEqualPlainBackward(comm->get(), torch::Device(torch::kCUDA, 0), /*bitwise=*/false,
                                           /*channels_last=*/true);
  at::globalContext().setAllowTF32CuDNN(tf32);
}

// Two ranks (threads), each with its own copy of the model and its own batch: after Finish()
// both hold the same mean of the two plain-backward gradients, laid out in reverse parameter
// order. Over shm the gradients are averaged in shared memory; over Gloo allreduced in buckets.
void ExpectTwoRanksAverage(const std::string& backend) {
  torch::manual_seed(5);
  auto base = *models::MakeModel("cnn", {1, 28, 28, 10});
  std::vector<torch::Tensor> x = {torch::randn({4, 1, 28, 28}), torch::randn({4, 1, 28, 28})};
  std::vector<torch::Tensor> y = {torch::randint(0, 10, {4}), torch::randint(0, 10, {4})};
  auto copy = [&] {
    auto m = *models::MakeModel("cnn", {1, 28, 28, 10});
    torch::NoGradGuard g;
    for (size_t i = 0; i < m->parameters().size(); ++i) m->parameters()[i].copy_(base->parameters()[i]);
    return m;
  };
  std::vector<std::vector<torch::Tensor>> plain(2);
  for (int r = 0; r < 2; ++r) {
    auto m = copy();
    torch::nn::functional::cross_entropy(m->forward(x[r]), y[r]).backward();
    for (auto& p : m->parameters()) plain[r].push_back(p.grad());
  }
  std::vector<torch::Tensor> want_parts;
  for (size_t k = plain[0].size(); k-- > 0;) want_parts.push_back(((plain[0][k] + plain[1][k]) / 2).flatten());
  torch::Tensor want = torch::cat(want_parts);

  MemoryStore store;
  std::vector<std::shared_ptr<models::Classifier>> models = {copy(), copy()};
  std::vector<torch::Tensor> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Result<std::unique_ptr<comm::Communicator>> comm = Unavailable("");
      if (backend == "shm") {
        comm::ShmOptions o;
        o.rank = r;
        o.size = 2;
        comm = comm::ConnectShm(store, o);
      } else {
        comm::GlooOptions o;
        o.rank = r;
        o.size = 2;
        comm = comm::ConnectGloo(store, o);
      }
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      GradientReducer reducer(models[r]->parameters(), comm->get(), 64 << 10);
      EXPECT_GT(reducer.bucket_count(), 2u);
      for (int step = 0; step < 2; ++step) {  // the second step checks the reuse of the buffers
        reducer.ZeroGrad();
        torch::nn::functional::cross_entropy(models[r]->forward(x[r]), y[r]).backward();
        ASSERT_TRUE(reducer.Finish().ok());
      }
      got[r] = reducer.flat_grads().clone();
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(got[0].defined() && got[1].defined());
  EXPECT_TRUE(torch::equal(got[0], got[1]));
  // Over shm every element is (a + b) / 2 in rank order, as computed here; Gloo's ring may
  // add in another order.
  EXPECT_TRUE(backend == "shm" ? torch::equal(got[0], want) : torch::allclose(got[0], want, 1e-5, 1e-6));
}

TEST(Reducer, TwoRanksGetTheMeanOfTheirGradientsThroughSharedMemory) { ExpectTwoRanksAverage("shm"); }
TEST(Reducer, TwoRanksGetTheMeanOfTheirGradientsThroughGloo) { ExpectTwoRanksAverage("gloo"); }

TEST(Data, APreloadedSplitIsTakenFromMemoryOnceAndReadAgainWhenItsFilesChange) {
  testing::Scratch s;
  ASSERT_EQ(::mkdir(s.path("d").c_str(), 0755), 0);
  // Four 2 x 2 images, every pixel `pixel`, labels 0 to 3; the files' times set to `mtime`.
  auto write = [&](char pixel, time_t mtime) {
    const std::string be4 = std::string("\0\0\0\x04", 4), be2 = std::string("\0\0\0\x02", 4);
    s.Write("d/train-images-idx3-ubyte", std::string("\0\0\x08\x03", 4) + be4 + be2 + be2 + std::string(16, pixel));
    s.Write("d/train-labels-idx1-ubyte", std::string("\0\0\x08\x01", 4) + be4 + std::string("\0\1\2\3", 4));
    const timespec times[2] = {{mtime, 0}, {mtime, 0}};
    for (const char* f : {"d/train-images-idx3-ubyte", "d/train-labels-idx1-ubyte"}) {
      ASSERT_EQ(::utimensat(AT_FDCWD, s.path(f).c_str(), times, 0), 0);
    }
  };
  auto first_pixel = [](const Result<data::ImageSet>& set) { return set.ok() ? int{set->pixels.at(0)} : -1; };
  DataSpec spec;
  spec.dataset = "mnist";
  spec.dir = s.path("d");
  write(1, 1000000);
  PreloadSplits(spec, /*test=*/false);
  // Other pixels behind the same size and time: what comes back is the preloaded copy, once, with
  // the normalization the preload computed from it.
  write(2, 1000000);
  Normalizer norm;
  auto preloaded = LoadSplit(spec, true, &norm);
  EXPECT_EQ(first_pixel(preloaded), 1);
  ASSERT_TRUE(preloaded.ok());
  EXPECT_EQ(norm.mean, Normalizer::Compute(*preloaded).mean);
  EXPECT_EQ(norm.std, Normalizer::Compute(*preloaded).std);
  EXPECT_NEAR(norm.mean.at(0), 1 / 255.0, 1e-7);
  auto read = LoadSplit(spec, true, &norm);
  EXPECT_EQ(first_pixel(read), 2);
  EXPECT_NEAR(norm.mean.at(0), 2 / 255.0, 1e-7);
  // A file changed since the preload is read again.
  PreloadSplits(spec, false);
  write(3, 2000000);
  EXPECT_EQ(first_pixel(LoadSplit(spec, true)), 3);
  // So is one replaced by another of the same size and time (as rsync -a or an atomic rename do).
  PreloadSplits(spec, false);
  const std::string images = s.path("d/train-images-idx3-ubyte");
  ASSERT_EQ(::rename(images.c_str(), s.path("d/old").c_str()), 0);
  write(4, 2000000);
  EXPECT_EQ(first_pixel(LoadSplit(spec, true)), 4);
}

TEST(Schedule, WarmupStepAndCosine) {
  OptimizerSpec o;
  o.lr = 0.1;
  ScheduleSpec s;
  s.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 0, 100, 1), 0.01);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 9, 100, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 50, 100, 1), 0.1);
  s.scale_by_world_size = true;
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 50, 100, 4), 0.4);
  s.scale_by_world_size = false;
  s.name = "step";
  s.step_size = 20;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 10 + 39, 100, 1), 0.05);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 10 + 40, 100, 1), 0.025);
  s.name = "cosine";
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 10, 110, 1), 0.1);
  EXPECT_NEAR(LearningRate(o, s, 60, 110, 1), 0.05, 1e-12);
  EXPECT_NEAR(LearningRate(o, s, 110, 110, 1), 0.0, 1e-12);
  // One cycle (OneCycleLR's defaults): from lr/25 up to lr over 30 % of the steps, then down.
  s = ScheduleSpec();
  s.name = "one_cycle";
  s.min_lr = 0.001;
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 0, 100, 1), 0.004);
  EXPECT_NEAR(LearningRate(o, s, 15, 100, 1), 0.052, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 30, 100, 1), 0.1);
  EXPECT_NEAR(LearningRate(o, s, 65, 100, 1), 0.0505, 1e-12);
  EXPECT_NEAR(LearningRate(o, s, 100, 100, 1), 0.001, 1e-12);
  s.warmup_steps = 10;  // the rise's own length
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 10, 100, 1), 0.1);
  EXPECT_GT(LearningRate(o, s, 5, 100, 1), LearningRate(o, s, 4, 100, 1));
}

}  // namespace
}  // namespace trainctl::train
