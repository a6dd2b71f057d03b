// A model from PyTorch: a module saved with torch.jit.script(model).save(path) (or torch.jit.trace),
// loaded with LibTorch's TorchScript loader and trained as the built-in models are. Its parameters
// and buffers are registered again, under the same dotted names, in a tree of torch::nn modules:
// the trainer's reducer, optimizer, checkpoints and exports see them as they see a built-in
// model's, while they remain the scripted module's own tensors (the reducer's move into its flat
// buffer, set_data, reaches both).
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/script.h>

#include <cstring>

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

namespace {

// LibTorch's reader over the bytes ReadModuleFile checked.
class BytesReader : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReader(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string& bytes_;
};

// Why LibTorch refused, in one line: its first, or for an error in the TorchScript interpreter
// (whose first line says only that an operation failed, then a traceback) the last, which says
// what went wrong ("expected input[2, 1, 28, 28] to have 3 channels, but got 1 ...").
std::string Cause(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10 ? c10->what_without_backtrace() : e.what();
  std::vector<std::string> lines;
  for (size_t start = 0; start <= text.size();) {
    size_t eol = text.find('\n', start);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(start, eol - start);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    if (!line.empty()) lines.push_back(line);
    start = eol + 1;
  }
  if (lines.empty()) return "an error without a message";
  if (lines.front().find("failed in the TorchScript interpreter") == std::string::npos || lines.size() == 1) {
    return lines.front();
  }
  std::string cause = lines.back();
  for (const char* prefix : {"RuntimeError: ", "builtins.RuntimeError: "}) {
    if (cause.rfind(prefix, 0) == 0) cause.erase(0, std::strlen(prefix));
  }
  return cause;
}

}  // namespace

Result<std::shared_ptr<Classifier>> LoadScripted(const checkpoint::ModuleFile& file, const InputShape& s) {
  const std::string& path = file.path;
  torch::jit::Module module;
  try {
    module = torch::jit::load(std::make_shared<BytesReader>(file.bytes), torch::kCPU);
  } catch (const std::exception& e) {
    return InvalidArgument(path +
                           ": not a TorchScript module LibTorch can load (save it with "
                           "torch.jit.script(model).save(path), not torch.save): " +
                           Cause(e));
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
                             " of a batch of 2 images of " + std::to_string(s.channels) + "x" + std::to_string(s.rows) +
                             "x" + std::to_string(s.cols) + "; expected [2, " + std::to_string(s.classes) +
                             "], one score per class");
    }
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": the module cannot take a batch of " + std::to_string(s.channels) + "x" +
                           std::to_string(s.rows) + "x" + std::to_string(s.cols) + " images: " + Cause(e));
  }
  return std::shared_ptr<Classifier>(model);
}

}  // namespace trainctl::models
