// A model from PyTorch: a module saved with torch.jit.script(model).save(path) (or torch.jit.trace),
// loaded with LibTorch's TorchScript loader and trained as the built-in models are. Its parameters
// and buffers are registered again, under the same dotted names, in a tree of torch::nn modules:
// the trainer's reducer, optimizer, checkpoints and exports see them as they see a built-in
// model's, while they remain the scripted module's own tensors (the reducer's move into its flat
// buffer, set_data, reaches both).
#include <torch/script.h>

#include "models/models.h"
#include "models/module_tree.h"

namespace trainctl::models {

torch::nn::Module& ModuleAt(torch::nn::Module& root, const std::string& prefix) {
  torch::nn::Module* at = &root;
  size_t start = 0;
  while (start < prefix.size()) {
    size_t dot = prefix.find('.', start);
    if (dot == std::string::npos) dot = prefix.size();
    const std::string part = prefix.substr(start, dot - start);
    std::shared_ptr<torch::nn::Module> next;
    for (const auto& child : at->named_children()) {
      if (child.key() == part) next = child.value();
    }
    if (!next) next = at->register_module(part, std::make_shared<torch::nn::Module>());
    at = next.get();
    start = dot + 1;
  }
  return *at;
}

std::pair<std::string, std::string> SplitLast(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

namespace {

class Scripted : public Classifier {
 public:
  explicit Scripted(torch::jit::Module module) : module_(std::move(module)) {
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      const auto [prefix, leaf] = SplitLast(p.name);
      ModuleAt(*this, prefix).register_parameter(leaf, p.value, p.value.requires_grad());
    }
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
      const auto [prefix, leaf] = SplitLast(b.name);
      ModuleAt(*this, prefix).register_buffer(leaf, b.value);
    }
  }

  torch::Tensor forward(torch::Tensor x) override { return module_.forward({x}).toTensor(); }

  void train(bool on = true) override {
    Classifier::train(on);
    module_.train(on);
  }

 private:
  torch::jit::Module module_;
};

}  // namespace

Result<std::shared_ptr<Classifier>> LoadScripted(const std::string& path, const InputShape& s) {
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    return InvalidArgument(path + ": not a TorchScript module LibTorch can load (save it with "
                           "torch.jit.script(model).save(path)): " + why);
  }
  auto model = std::make_shared<Scripted>(std::move(module));
  if (model->parameters().empty()) return InvalidArgument(path + ": the TorchScript module has no parameters to train");
  // What it makes of a batch of the data's images: one score per class, or a located error now
  // rather than in the first step.
  try {
    torch::NoGradGuard no_grad;
    model->eval();
    torch::Tensor out = model->forward(torch::zeros({2, s.channels, s.rows, s.cols}));
    model->train();
    if (out.dim() != 2 || out.size(0) != 2 || out.size(1) != s.classes) {
      return InvalidArgument(path + ": the module makes " + (out.dim() == 0 ? "a scalar" : c10::str(out.sizes())) +
                             " of a batch of 2 images of " + std::to_string(s.channels) + "x" +
                             std::to_string(s.rows) + "x" + std::to_string(s.cols) + "; expected [2, " +
                             std::to_string(s.classes) + "], one score per class");
    }
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    return InvalidArgument(path + ": the module cannot take a batch of " + std::to_string(s.channels) + "x" +
                           std::to_string(s.rows) + "x" + std::to_string(s.cols) + " images: " + why);
  }
  return std::shared_ptr<Classifier>(model);
}

}  // namespace trainctl::models
