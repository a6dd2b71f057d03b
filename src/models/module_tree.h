// Modules at dotted paths ("layer1.0.conv1"), as PyTorch names nested modules: what a declared
// model and a TorchScript module register their layers and tensors under. Internal to models/.
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <utility>

namespace trainctl::models {

// The module at `path` under `root` ("layer1.0"; "" is root), plain torch::nn::Modules made where
// missing.
torch::nn::Module& ModuleAt(torch::nn::Module& root, const std::string& path);
// "layer1.0.conv1" -> {"layer1.0", "conv1"}; "fc" -> {"", "fc"}.
std::pair<std::string, std::string> SplitLast(const std::string& name);

}  // namespace trainctl::models
