// The built-in models on LibTorch: the 2-conv CNN (28x28 or 32x32 inputs, any channel count),
// ResNet-18 / ResNet-50 with torchvision's layer shapes and parameter names, so a state exported
// as safetensors loads into the same torchvision model in Python; all three are declarations of
// layers (jobspec/layers.h: BuiltinLayers), built and run as a model declared in a spec is; and a
// TorchScript module a user scripted (scripted.cc), read as code is (checkpoint/module_file.h).
// The CPU kernels they call are kernels/.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>

#include "checkpoint/module_file.h"
#include "common/status.h"
#include "jobspec/layers.h"

namespace trainctl::models {

class Classifier : public torch::nn::Module {
 public:
  // x: N x C x H x W float; returns N x classes logits.
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

struct InputShape {
  int channels = 1, rows = 28, cols = 28;
  int classes = 10;
};

// "cnn", "resnet18" or "resnet50", or "layers": the model `layers` declares (named, and checked
// against `shape` by SummarizeModel; jobspec/layers.h). kInvalidArgument for an unknown name or a
// shape the model cannot take (the CNN needs rows and cols divisible by 4).
// "torchscript": the module `torchscript` holds (LoadScripted; required).
Result<std::shared_ptr<Classifier>> MakeModel(const std::string& name, const InputShape& shape,
                                              const std::vector<LayerSpec>& layers = {},
                                              const checkpoint::ModuleFile* torchscript = nullptr);
// A module saved by PyTorch with torch.jit.script(model).save(path) (models/scripted.cc), from the
// bytes checkpoint::ReadModuleFile read and checked (never a path LibTorch would open again), its
// parameters and buffers under their PyTorch names; checked on a batch of `shape`'s images (one
// score per class). kInvalidArgument naming the file otherwise, with the interpreter's reason.
Result<std::shared_ptr<Classifier>> LoadScripted(const checkpoint::ModuleFile& file, const InputShape& shape);
// The declared model (models/declared.cc); MakeModel checks the layers first.
std::shared_ptr<Classifier> MakeDeclared(const std::vector<LayerSpec>& layers, const InputShape& shape);

}  // namespace trainctl::models
