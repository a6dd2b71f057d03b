#include "models/models.h"

#include "models/ops.h"
#if TRAINCTL_HAVE_ONEDNN
#include "models/onednn.h"
#endif

#include <optional>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

namespace trainctl::models {
namespace {

namespace F = torch::nn::functional;
using torch::nn::Conv2d;
using torch::nn::Conv2dOptions;

// conv(3x3) -> max-pool(2) -> ReLU, twice, then two linear layers. Pooling before the ReLU gives
// the same result as after it (both are monotone) on a quarter of the elements.
class Cnn : public Classifier {
 public:
  explicit Cnn(const InputShape& s)
      : conv1_(register_module("conv1", Conv2d(Conv2dOptions(s.channels, 32, 3).padding(1)))),
        conv2_(register_module("conv2", Conv2d(Conv2dOptions(32, 64, 3).padding(1)))),
        fc1_(register_module("fc1", torch::nn::Linear(64 * (s.rows / 4) * (s.cols / 4), 128))),
        fc2_(register_module("fc2", torch::nn::Linear(128, s.classes))) {}

  torch::Tensor forward(torch::Tensor x) override {
    const bool cpu = x.is_cpu() && x.scalar_type() == torch::kFloat32;
    bool bf16 = false;
#if TRAINCTL_HAVE_ONEDNN
    // Without bf16 instructions the CNN stays f32 on the CPU under autocast (trainer.precision:
    // bf16), as its own kernels below do: ATen would emulate bf16, ten times slower than f32.
    std::optional<c10::impl::ExcludeDispatchKeyGuard> f32;
    if (x.is_cpu() && at::autocast::is_cpu_enabled() && !Bf16Convolutions()) f32.emplace(c10::DispatchKey::AutocastCPU);
    bf16 = at::autocast::is_cpu_enabled() && at::autocast::get_autocast_cpu_dtype() == at::kBFloat16 &&
           Bf16Convolutions() && x.size(1) < kBlock && BlockedConvolutions();
#endif
    if (cpu && !x.requires_grad()) {
      // Our own kernels, each pooling as it writes (ops.h): Winograd's for the second, its
      // products in AVX-512 where the CPU has it (0.8x the time of oneDNN's f32 kernels there);
      // in bf16, where the CPU multiplies in bf16, oneDNN's for the second (Bf16Conv2).
      x = ImageConvPoolRelu(x, conv1_->weight, conv1_->bias);
      x = bf16 ? Bf16Conv2(x) : ConvPoolRelu(x, conv2_->weight, conv2_->bias);
    } else {
      x = PoolRelu(conv1_(x));  // an input that takes a gradient, or a GPU
      x = cpu ? ConvPoolRelu(x, conv2_->weight, conv2_->bias) : PoolRelu(conv2_(x));
    }
#if TRAINCTL_HAVE_ONEDNN
    if (cpu) {
      // oneDNN's sgemm on AVX2 too (onednn.h): the linear layers in about 0.8x ATen's time (in
      // f32 under bf16 autocast too: oneDNN has no bf16 sgemm).
      return Linear(torch::relu(Linear(x.flatten(1), fc1_->weight, fc1_->bias)), fc2_->weight, fc2_->bias);
    }
#endif
    return fc2_(torch::relu(fc1_(x.flatten(1))));
  }

  // Under autocast to bf16 (trainer.precision) on a CPU that multiplies in bf16: the second
  // convolution in oneDNN's bf16 kernels, in its blocked layout up to the last pooling (0.9x the
  // f32 Winograd kernels' time). The first, on the image's one or three channels, is no faster in
  // bf16 and stays ours in f32.
  torch::Tensor Bf16Conv2(const torch::Tensor& x) {
#if TRAINCTL_HAVE_ONEDNN
    return FromBlocked(MaxPool2x2Relu(Conv3x3(ToBlocked(x), conv2_->weight, conv2_->bias, /*bf16=*/true)));
#else
    return ConvPoolRelu(x, conv2_->weight, conv2_->bias);  // not reached: bf16 needs oneDNN
#endif
  }

  // After ATen's convolutions: on the CPU our pooling, on ATen's N x C x H x W as it is (ATen's
  // max-pool is slow there, see ops.h).
  static torch::Tensor PoolRelu(const torch::Tensor& x) {
    if (x.is_cpu() && x.scalar_type() == torch::kFloat32) return MaxPool2x2Relu(x);
    return torch::relu(F::max_pool2d(x, F::MaxPool2dFuncOptions(2)));
  }

 private:
  Conv2d conv1_, conv2_;
  torch::nn::Linear fc1_, fc2_;
};

Conv2d Conv(int in, int out, int kernel, int stride, int padding) {
  return Conv2d(Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

// torchvision's BasicBlock (ResNet-18/34) and Bottleneck (ResNet-50, stride on the 3x3 conv).
class Block : public torch::nn::Module {
 public:
  Block(int in, int width, int stride, bool bottleneck) : bottleneck_(bottleneck) {
    int out = width * expansion(bottleneck);
    if (bottleneck) {
      convs_ = {Conv(in, width, 1, 1, 0), Conv(width, width, 3, stride, 1), Conv(width, out, 1, 1, 0)};
    } else {
      convs_ = {Conv(in, width, 3, stride, 1), Conv(width, width, 3, 1, 1)};
    }
    for (size_t i = 0; i < convs_.size(); ++i) {
      int channels = convs_[i]->options.out_channels();
      register_module("conv" + std::to_string(i + 1), convs_[i]);
      bns_.push_back(register_module("bn" + std::to_string(i + 1), torch::nn::BatchNorm2d(channels)));
    }
    if (stride != 1 || in != out) {
      downsample_ = register_module(
          "downsample", torch::nn::Sequential(Conv(in, out, 1, stride, 0), torch::nn::BatchNorm2d(out)));
    }
  }
  static int expansion(bool bottleneck) { return bottleneck ? 4 : 1; }

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = x;
    for (size_t i = 0; i < convs_.size(); ++i) {
      y = bns_[i](convs_[i](y));
      if (i + 1 < convs_.size()) y = torch::relu(y);
    }
    torch::Tensor shortcut = downsample_.is_empty() ? x : downsample_->forward(x);
    return torch::relu(y + shortcut);
  }

 private:
  bool bottleneck_;
  std::vector<Conv2d> convs_;
  std::vector<torch::nn::BatchNorm2d> bns_;
  torch::nn::Sequential downsample_{nullptr};
};

class ResNet : public Classifier {
 public:
  ResNet(const InputShape& s, std::array<int, 4> blocks, bool bottleneck) {
    conv1_ = register_module("conv1", Conv(s.channels, 64, 7, 2, 3));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(64));
    int in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      int width = 64 << stage;
      torch::nn::Sequential layer;
      for (int b = 0; b < blocks[stage]; ++b) {
        int stride = (stage > 0 && b == 0) ? 2 : 1;
        layer->push_back(std::make_shared<Block>(in, width, stride, bottleneck));
        in = width * Block::expansion(bottleneck);
      }
      layers_.push_back(register_module("layer" + std::to_string(stage + 1), layer));
    }
    fc_ = register_module("fc", torch::nn::Linear(in, s.classes));
    // torchvision's initialization: Kaiming normal for convolutions, BN weight 1 and bias 0.
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* c = m->as<torch::nn::Conv2dImpl>()) {
        torch::nn::init::kaiming_normal_(c->weight, 0, torch::kFanOut, torch::kReLU);
      }
    }
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(bn1_(conv1_(x)));
    x = F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
    for (auto& layer : layers_) x = layer->forward(x);
    x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
    return fc_(x);
  }

 private:
  Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  std::vector<torch::nn::Sequential> layers_;
  torch::nn::Linear fc_{nullptr};
};

}  // namespace

Result<std::shared_ptr<Classifier>> MakeModel(const std::string& name, const InputShape& s,
                                              const std::vector<LayerSpec>& layers, const std::string& torchscript) {
  if (s.channels < 1 || s.rows < 1 || s.cols < 1 || s.classes < 2) {
    return InvalidArgument("model " + name + ": invalid input shape");
  }
  if (name == "torchscript") return LoadScripted(torchscript, s);
  if (name == "layers") {
    RETURN_IF_ERROR(SummarizeModel(layers, {s.channels, s.rows, s.cols}, s.classes).status());
    return MakeDeclared(layers, s);
  }
  if (name == "cnn") {
    if (s.rows % 4 != 0 || s.cols % 4 != 0) {
      return InvalidArgument("model cnn: expected images whose height and width divide by 4 "
                             "(28x28, 32x32), got " + std::to_string(s.rows) + "x" +
                             std::to_string(s.cols));
    }
    return std::shared_ptr<Classifier>(std::make_shared<Cnn>(s));
  }
  if (name == "resnet18") return std::shared_ptr<Classifier>(std::make_shared<ResNet>(s, std::array<int, 4>{2, 2, 2, 2}, false));
  if (name == "resnet50") return std::shared_ptr<Classifier>(std::make_shared<ResNet>(s, std::array<int, 4>{3, 4, 6, 3}, true));
  return InvalidArgument("unknown model " + name + "; expected cnn, resnet18, resnet50 or declared layers");
}

}  // namespace trainctl::models
