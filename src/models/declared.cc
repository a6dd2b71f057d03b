// A model declared in the spec as a list of layers (jobspec/layers.h), and the built-in models
// (BuiltinLayers there), built from torch::nn's modules and run by the trainer's own kernels
// wherever they serve (kernels/ops.h):
//   - conv 3x3 (stride 1, padding 1, a bias, output channels a multiple of 16) followed by
//     maxpool 2 and relu, in either order, or by maxpool 2 alone: one pass that pools the convolution's output while it
//     is in cache (ImageConvPoolRelu on the model's input image, ConvPoolRelu on a hidden layer of
//     a multiple of 16 channels: Winograd's F(2x2, 3x3); under bf16 autocast on a CPU with bf16
//     instructions, oneDNN's bf16 convolution in its blocked layout, then our pooling);
//   - maxpool 2, followed by relu or not: MaxPool2x2Relu, branch-free;
//   - batch norm in training on an image-shaped CPU activation (f32, or bf16 from a convolution
//     under autocast, taken in f32), followed by relu or not: BatchNormRelu, two passes each way;
//   - any other convolution of groups 1 on the CPU (f32, or bf16 under autocast on a CPU with bf16
//     instructions): oneDNN's, channels-last, with no conversions around it (Convolution), where
//     oneDNN has generated kernels for the shape;
//   - linear (with a bias) on the CPU: oneDNN's sgemm where this build has oneDNN;
// and everything else, every shape and device, by ATen. The first forward pass says, at debug
// level, which layer ran where.
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <optional>

#include "common/log.h"
#include "common/strings.h"
#include "kernels/ops.h"
#include "models/models.h"
#include "models/module_tree.h"
#if TRAINCTL_HAVE_ONEDNN
#include "kernels/onednn.h"
#endif

namespace trainctl::models {
namespace {

namespace F = torch::nn::functional;
using Kind = LayerSpec::Kind;

// Registers `module` under a dotted name ("layer1.0.conv1"), making the plain modules on its way,
// so its parameters are named as in PyTorch ("layer1.0.conv1.weight").
template <typename M>
M RegisterAt(torch::nn::Module& root, const std::string& name, M module) {
  const auto [path, leaf] = SplitLast(name);
  return ModuleAt(root, path).register_module(leaf, module);
}

// A layer, built.
struct Built {
  LayerSpec spec;           // with its defaults
  std::vector<int64_t> in;  // the input's shape (channels, rows, cols or features), per image
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn2{nullptr};
  torch::nn::BatchNorm1d bn1{nullptr};
  torch::nn::Linear linear{nullptr};
  std::vector<Built> body;                    // residual
  torch::nn::Sequential projection{nullptr};  // residual: conv 1x1 and batch norm, or none
};

bool IsPool2(const LayerSpec& l) {
  return l.kind == Kind::kMaxPool && l.kernel == 2 && l.stride == 2 && l.padding == 0;
}

class Declared : public Classifier {
 public:
  Declared(const std::vector<LayerSpec>& layers, const InputShape& s) {
    std::vector<int64_t> shape = {s.channels, s.rows, s.cols};
    layers_ = Build(layers, &shape, s.classes);
  }

  torch::Tensor forward(torch::Tensor x) override {
    std::optional<c10::impl::ExcludeDispatchKeyGuard> f32;
#if TRAINCTL_HAVE_ONEDNN
    // Without bf16 instructions the model stays f32 on the CPU under autocast (trainer.precision:
    // bf16), as the trainer's own kernels do: ATen would emulate bf16, ten times slower than f32.
    if (x.is_cpu() && at::autocast::is_cpu_enabled() && !kernels::Bf16Convolutions())
      f32.emplace(c10::DispatchKey::AutocastCPU);
#endif
    const bool say = !said_;
    said_ = true;
    std::vector<std::string> where;
    x = Run(layers_, x, /*input=*/true, "", say ? &where : nullptr);
    if (say) LOG_DEBUG("the declared model's layers run on: {}", Join(where, "; "));
    return x;
  }

 private:
  std::vector<Built> Build(const std::vector<LayerSpec>& layers, std::vector<int64_t>* shape, int classes) {
    std::vector<Built> out;
    for (size_t i = 0; i < layers.size(); ++i) {
      Built b;
      b.spec = WithDefaults(layers[i]);
      b.in = *shape;
      const LayerSpec& l = b.spec;
      switch (l.kind) {
        case Kind::kConv:
          b.conv = RegisterAt(*this, l.name,
                              torch::nn::Conv2d(torch::nn::Conv2dOptions((*shape)[0], l.out, l.kernel)
                                                    .stride(l.stride)
                                                    .padding(l.padding)
                                                    .groups(l.groups)
                                                    .bias(l.bias)));
          *shape = {l.out, Slide((*shape)[1], l), Slide((*shape)[2], l)};
          break;
        case Kind::kBatchNorm:
          if (shape->size() == 3)
            b.bn2 = RegisterAt(*this, l.name, torch::nn::BatchNorm2d((*shape)[0]));
          else
            b.bn1 = RegisterAt(*this, l.name, torch::nn::BatchNorm1d((*shape)[0]));
          break;
        case Kind::kLinear: {
          const int64_t features = l.out > 0 ? l.out : classes;
          b.linear = RegisterAt(*this, l.name,
                                torch::nn::Linear(torch::nn::LinearOptions((*shape)[0], features).bias(l.bias)));
          *shape = {features};
          break;
        }
        case Kind::kMaxPool:
        case Kind::kAvgPool:
          *shape = {(*shape)[0], Slide((*shape)[1], l), Slide((*shape)[2], l)};
          break;
        case Kind::kGlobalAvgPool:
          *shape = {(*shape)[0], 1, 1};
          break;
        case Kind::kFlatten: {
          int64_t n = 1;
          for (int64_t d : *shape) n *= d;
          *shape = {n};
          break;
        }
        case Kind::kResidual: {
          std::vector<int64_t> in = *shape;
          b.body = Build(l.body, shape, classes);
          if (l.projection == "conv" || (l.projection == "auto" && *shape != in)) {
            const int64_t stride = std::max<int64_t>(1, ProjectionStride(in, *shape));  // checked: SummarizeModel
            b.projection = RegisterAt(
                *this, l.name + ".downsample",
                torch::nn::Sequential(
                    torch::nn::Conv2d(torch::nn::Conv2dOptions(in[0], (*shape)[0], 1).stride(stride).bias(false)),
                    torch::nn::BatchNorm2d((*shape)[0])));
          }
          break;
        }
        default:
          break;
      }
      out.push_back(std::move(b));
    }
    return out;
  }

  static int64_t Slide(int64_t size, const LayerSpec& l) { return SlideWindow(size, l.kernel, l.stride, l.padding); }

  static bool IsRelu(const std::vector<Built>& layers, size_t i) {
    return i < layers.size() && layers[i].spec.kind == Kind::kRelu;
  }

  // How many layers from layers[i] the trainer's kernels run in one pass on this input: 3 for a
  // 3x3 convolution followed by maxpool 2 and relu (in either order), 2 for one followed by
  // maxpool 2 alone (batch norm before the relu), 0 where they cannot.
  static size_t Fusable(const std::vector<Built>& layers, size_t i, const torch::Tensor& x, bool input) {
    if (i + 1 >= layers.size()) return 0;
    const LayerSpec& c = layers[i].spec;
    size_t n = 0;
    if (IsPool2(layers[i + 1].spec))
      n = IsRelu(layers, i + 2) ? 3 : 2;
    else if (IsRelu(layers, i + 1) && i + 2 < layers.size() && IsPool2(layers[i + 2].spec))
      n = 3;
    if (n == 0 || c.kind != Kind::kConv || c.kernel != 3 || c.stride != 1 || c.padding != 1 || c.groups != 1 ||
        !c.bias || c.out % 16 != 0 || !kernels::WinogradConvolutions()) {
      return 0;
    }
    if (!x.is_cpu() || x.scalar_type() != torch::kFloat32 || x.dim() != 4 || x.size(2) % 2 || x.size(3) % 2) return 0;
    return (input ? !x.requires_grad() : x.size(1) % 16 == 0) ? n : 0;
  }

  static torch::Tensor Bf16ConvPoolRelu(const torch::Tensor& x, const Built& b, bool relu) {
#if TRAINCTL_HAVE_ONEDNN
    return kernels::FromBlocked(kernels::MaxPool2x2Relu(
        kernels::Conv3x3(kernels::ToBlocked(x), b.conv->weight, b.conv->bias, /*bf16=*/true), relu));
#else
    return kernels::ConvPoolRelu(x, b.conv->weight, b.conv->bias, relu);  // not reached: Bf16Blocked() is false
#endif
  }

  // Under autocast to bf16 on a CPU that multiplies in bf16.
  static bool Bf16Autocast() {
#if TRAINCTL_HAVE_ONEDNN
    return at::autocast::is_cpu_enabled() && at::autocast::get_autocast_cpu_dtype() == at::kBFloat16 &&
           kernels::Bf16Convolutions();
#else
    return false;
#endif
  }

  // Under autocast to bf16 (trainer.precision) on a CPU that multiplies in bf16 and has oneDNN's
  // blocked kernels: a fusable hidden convolution in oneDNN's bf16 kernels, in its blocked layout
  // up to the pooling (0.9x the f32 Winograd kernels' time for the example CNN's 32 -> 64 layer).
  static bool Bf16Blocked() {
#if TRAINCTL_HAVE_ONEDNN
    return Bf16Autocast() && kernels::BlockedConvolutions();
#else
    return false;
#endif
  }
  // Any other convolution of a CPU image batch (groups 1), channels-last through oneDNN where it
  // has generated kernels for it (kernels/onednn.h: no conversions around it, an f32 result that
  // the batch norm after takes as it is); undefined elsewhere, for ATen's.
  static torch::Tensor OneDnnConv(const torch::Tensor& x, const Built& b) {
#if TRAINCTL_HAVE_ONEDNN
    const LayerSpec& l = b.spec;
    if (x.is_cpu() && x.dim() == 4 && (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16) &&
        l.groups == 1) {
      const bool bf16 = Bf16Autocast();
      c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
      return kernels::Convolution(x, b.conv->weight, b.conv->bias, l.stride, l.padding, bf16);
    }
#endif
    return {};
  }

  // Batch norm in training, and the relu after it, by our kernels, as BatchNorm2d's forward does
  // it: the batch count moves, and the running statistics by the momentum (or, where it is unset,
  // as a cumulative average).
  static torch::Tensor TrainBatchNorm(const torch::Tensor& x, torch::nn::BatchNorm2d& bn, bool relu) {
    const auto& o = bn->options;
    double momentum = 0;
    torch::Tensor mean, var;
    if (o.track_running_stats()) {
      {
        torch::NoGradGuard no_grad;
        bn->num_batches_tracked += 1;
      }
      momentum = o.momentum() ? *o.momentum() : 1.0 / bn->num_batches_tracked.item<double>();
      mean = bn->running_mean;
      var = bn->running_var;
    }
    return kernels::BatchNormRelu(x, bn->weight, bn->bias, mean, var, momentum, o.eps(), relu);
  }

  // A convolution: with the pooling and ReLU after it in one of our kernels where they fuse (the
  // image's first layer; Winograd; oneDNN's bf16 blocked convolution), else oneDNN's or ATen's.
  // Returns how many layers it ran; `how` says whose kernels.
  size_t Conv(std::vector<Built>& layers, size_t i, bool first, torch::Tensor* x, std::string* how) {
    Built& b = layers[i];
    if (const size_t fused = Fusable(layers, i, *x, first)) {
      const bool relu = fused == 3;
      const std::string pool = relu ? "maxpool+relu" : "maxpool";
      if (first) {
        *x = kernels::ImageConvPoolRelu(*x, b.conv->weight, b.conv->bias, relu);
        *how = "ours (conv+" + pool + ", image)";
      } else if (Bf16Blocked()) {
        *x = Bf16ConvPoolRelu(*x, b, relu);
        *how = "oneDNN bf16 (conv, blocked) + ours (" + pool + ")";
      } else {
        *x = kernels::ConvPoolRelu(*x, b.conv->weight, b.conv->bias, relu);
        *how = "ours (conv+" + pool + ", Winograd)";
      }
      return fused;
    }
    if (torch::Tensor y = OneDnnConv(*x, b); y.defined()) {
      *x = y;
      *how = Bf16Autocast() ? "oneDNN bf16 (conv, channels-last)" : "oneDNN (conv, channels-last)";
    } else {
      *x = b.conv->forward(*x);
      *how = "ATen";
    }
    return 1;
  }

  torch::Tensor Run(std::vector<Built>& layers, torch::Tensor x, bool input, const std::string& prefix,
                    std::vector<std::string>* where) {
    auto note = [&](size_t i, const std::string& how) {
      if (where) where->push_back(prefix + std::to_string(i) + " " + LayerKindName(layers[i].spec.kind) + ": " + how);
    };
    for (size_t i = 0; i < layers.size(); ++i) {
      Built& b = layers[i];
      const LayerSpec& l = b.spec;
      const bool cpu_f32 = x.is_cpu() && x.scalar_type() == torch::kFloat32;
      switch (l.kind) {
        case Kind::kConv: {
          std::string how;
          const size_t ran = Conv(layers, i, input && i == 0, &x, &how);
          note(i, how);
          i += ran - 1;
          break;
        }
        case Kind::kBatchNorm:
          // A bf16 activation (a convolution's under autocast) too, in f32: ATen's bf16 batch norm
          // and ReLU cost more than the conversion.
          if (b.bn2 && b.bn2->weight.defined() && x.is_cpu() &&
              (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16) && is_training() &&
              x.dim() == 4 && x.numel() > x.size(1)) {
            const bool relu = IsRelu(layers, i + 1);
            x = TrainBatchNorm(x.to(torch::kFloat32), b.bn2, relu);
            note(i, relu ? "ours (batchnorm+relu)" : "ours (batchnorm)");
            if (relu) ++i;
          } else {
            x = b.bn2 ? b.bn2->forward(x) : b.bn1->forward(x);
            note(i, "ATen");
          }
          break;
        case Kind::kRelu:
          x = torch::relu(x);
          note(i, "ATen");
          break;
        case Kind::kGelu:
          x = torch::gelu(x);
          note(i, "ATen");
          break;
        case Kind::kMaxPool:
          if (IsPool2(l) && cpu_f32 && x.dim() == 4 && x.size(2) % 2 == 0 && x.size(3) % 2 == 0) {
            const bool relu = IsRelu(layers, i + 1);
            x = kernels::MaxPool2x2Relu(x, relu);
            note(i, relu ? "ours (maxpool+relu)" : "ours (maxpool)");
            if (relu) ++i;
          } else {
            x = F::max_pool2d(x, F::MaxPool2dFuncOptions(l.kernel).stride(l.stride).padding(l.padding));
            note(i, "ATen");
          }
          break;
        case Kind::kAvgPool:
          x = F::avg_pool2d(x, F::AvgPool2dFuncOptions(l.kernel).stride(l.stride).padding(l.padding));
          note(i, "ATen");
          break;
        case Kind::kGlobalAvgPool:
          x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1));
          note(i, "ATen");
          break;
        case Kind::kFlatten:
          x = x.flatten(1);
          break;
        case Kind::kLinear:
#if TRAINCTL_HAVE_ONEDNN
          if (cpu_f32 && l.bias) {
            x = kernels::Linear(x.contiguous(), b.linear->weight, b.linear->bias);
            note(i, "oneDNN");
            break;
          }
#endif
          x = b.linear->forward(x);
          note(i, "ATen");
          break;
        case Kind::kDropout:
          x = F::dropout(x, F::DropoutFuncOptions().p(l.p).training(is_training()));
          break;
        case Kind::kResidual: {
          torch::Tensor y = Run(b.body, x, false, prefix + std::to_string(i) + ".", where);
          x = y + (b.projection ? b.projection->forward(x) : x);
          break;
        }
      }
    }
    return x;
  }

  std::vector<Built> layers_;
  bool said_ = false;
};

}  // namespace

std::shared_ptr<Classifier> MakeDeclared(const std::vector<LayerSpec>& layers, const InputShape& shape) {
  return std::make_shared<Declared>(layers, shape);
}

}  // namespace trainctl::models
