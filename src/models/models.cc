#include "models/models.h"

#include <torch/nn/init.h>
#include <torch/nn/modules/conv.h>

namespace trainctl::models {

Result<std::shared_ptr<Classifier>> MakeModel(const std::string& name, const InputShape& s,
                                              const std::vector<LayerSpec>& layers,
                                              const checkpoint::ModuleFile* torchscript) {
  if (s.channels < 1 || s.rows < 1 || s.cols < 1 || s.classes < 2) {
    return InvalidArgument("model " + name + ": invalid input shape");
  }
  if (name == "torchscript") {
    if (!torchscript) return InvalidArgument("model torchscript: no module file was given");
    return LoadScripted(*torchscript, s);
  }
  if (name == "layers") {
    RETURN_IF_ERROR(SummarizeModel(layers, {s.channels, s.rows, s.cols}, s.classes).status());
    return MakeDeclared(layers, s);
  }
  if (name == "cnn" && (s.rows % 4 != 0 || s.cols % 4 != 0)) {
    return InvalidArgument("model cnn: expected images whose height and width divide by 4 (28x28, 32x32), got " +
                           std::to_string(s.rows) + "x" + std::to_string(s.cols));
  }
  if (auto builtin = BuiltinLayers(name)) {
    auto model = MakeDeclared(*builtin, s);
    if (name != "cnn") {
      // torchvision's initialization: Kaiming normal for the convolutions (BN weight 1 and bias 0,
      // as built), in the order the modules were made.
      for (auto& m : model->modules(/*include_self=*/false)) {
        if (auto* c = m->as<torch::nn::Conv2dImpl>()) {
          torch::nn::init::kaiming_normal_(c->weight, 0, torch::kFanOut, torch::kReLU);
        }
      }
    }
    return model;
  }
  return InvalidArgument("unknown model " + name + "; expected cnn, resnet18, resnet50 or declared layers");
}

}  // namespace trainctl::models
