// Unit tests of the built-in models (models/): the shapes and initial weights of the declared CNN
// and ResNets, declared layers against ATen's operations, PyTorch's parameter names, and a
// TorchScript module trained as PyTorch computes it.
#include "models/models.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <map>
#include <set>

#include "jobspec/job_spec.h"
#include "tests/test_util.h"

namespace trainctl::models {
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
  torch::nn::Conv2d conv1(torch::nn::Conv2dOptions(1, 32, 3).padding(1)),
      conv2(torch::nn::Conv2dOptions(32, 64, 3).padding(1));
  torch::nn::Linear fc1(64 * 7 * 7, 128), fc2(128, 10);
  const std::map<std::string, torch::Tensor> former = {{"conv1.weight", conv1->weight}, {"conv1.bias", conv1->bias},
                                                       {"conv2.weight", conv2->weight}, {"conv2.bias", conv2->bias},
                                                       {"fc1.weight", fc1->weight},     {"fc1.bias", fc1->bias},
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
      case K::kRelu:
        x = torch::relu(x);
        break;
      case K::kGelu:
        x = torch::gelu(x);
        break;
      case K::kMaxPool:
        x = torch::max_pool2d(x, l.kernel, l.stride, l.padding);
        break;
      case K::kAvgPool:
        x = torch::avg_pool2d(x, l.kernel, l.stride, l.padding);
        break;
      case K::kGlobalAvgPool:
        x = torch::adaptive_avg_pool2d(x, {1, 1});
        break;
      case K::kFlatten:
        x = x.flatten(1);
        break;
      case K::kLinear:
        x = torch::linear(x, p(l.name + ".weight"), p(l.name + ".bias"));
        break;
      case K::kDropout:
        break;  // p: 0 in these tests
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
                                             "layer1.0.bn1.weight", "layer1.0.bn1.bias", "layer1.0.downsample.0.weight",
                                             "layer1.0.downsample.1.weight", "layer1.0.downsample.1.bias", "fc.weight",
                                             "fc.bias"}));
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
  auto made = testing::RunProgram(
      {TRAINCTL_TEST_PYTHON, std::string(TRAINCTL_SOURCE_DIR) + "/tests/python/scripted_models.py", s.path("models")},
      s.path(""));
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
  auto pickled =
      testing::RunProgram({TRAINCTL_TEST_PYTHON, "-c",
                           "import sys, torch\ntorch.save(torch.nn.Linear(4, 2), sys.argv[1] + '/pickled.pt')\n"
                           "torch.save(torch.nn.Linear(4, 2).state_dict(), sys.argv[1] + '/state.pt')\n",
                           s.path("models")},
                          s.path(""));
  ASSERT_EQ(pickled.exit.code, 0) << pickled.output;
  for (const char* name : {"models/pickled.pt", "models/state.pt"}) {
    const auto m = module(name);
    auto bad = models::MakeModel("torchscript", {1, 28, 28, 10}, {}, &m);
    ASSERT_FALSE(bad.ok()) << name;
    EXPECT_NE(
        bad.status().message().find(std::string(name) + ": not a TorchScript module LibTorch can load (save it with "
                                                        "torch.jit.script(model).save(path), not torch.save)"),
        std::string::npos)
        << bad.status().message();
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

}  // namespace
}  // namespace trainctl::models
