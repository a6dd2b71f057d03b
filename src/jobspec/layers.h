// A model declared in the job spec (trainer.model: {layers: [...]}) as a list of layers, in
// PyTorch's terms, and what can be known of it without LibTorch: each layer's output shape and
// parameter count, checked against the data's image shape and class count when the spec is
// validated, so a mismatch is named before anything starts. models/declared.cc builds it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl {

struct LayerSpec {
  enum class Kind {
    kConv,       // torch.nn.Conv2d
    kBatchNorm,  // BatchNorm2d on images, BatchNorm1d on features
    kRelu,
    kGelu,
    kMaxPool,        // MaxPool2d
    kAvgPool,        // AvgPool2d
    kGlobalAvgPool,  // AdaptiveAvgPool2d(1): C x H x W -> C x 1 x 1
    kFlatten,        // C x H x W -> C*H*W
    kLinear,
    kDropout,
    kResidual,  // body(x) + x, or + projection(x) where the body changes the shape
  };
  Kind kind = Kind::kRelu;
  // The parameters' prefix in checkpoints and exported models ("conv1" -> "conv1.weight"); named
  // by NameLayers where the spec gives none.
  std::string name;
  int64_t out = 0;  // conv: output channels; linear: output features (0: the data's classes)
  int64_t kernel = 0, stride = 0, padding = 0, groups = 1;  // conv, pools (0: the defaults)
  bool bias = true;                                         // conv, linear
  double p = 0.5;                                           // dropout
  std::vector<LayerSpec> body;                              // residual
  // residual: "auto" (a 1x1 convolution and batch norm, torchvision's downsample, where the body
  // changes the shape), "conv" (always), "none" (the body must keep the shape).
  std::string projection = "auto";
  std::string origin;  // where the spec declared it ("job.yaml:12"), for errors; not serialized
};

// "conv", "batchnorm", ... as the spec writes them; the reverse, or nullopt.
const char* LayerKindName(LayerSpec::Kind kind);
std::optional<LayerSpec::Kind> LayerKindFromName(const std::string& name);
std::vector<std::string> LayerKindNames();
// Defaults filled in: a convolution's kernel 3 and stride 1, a pool's stride its kernel (2).
LayerSpec WithDefaults(LayerSpec layer);

// A dimension after a window of `kernel` moved by `stride` over `size` padded by `padding` on
// both sides, as PyTorch computes it (rounding down); below 1 when the window does not fit.
int64_t SlideWindow(int64_t size, int64_t kernel, int64_t stride, int64_t padding);
// The stride of the 1x1 convolution that takes an image of shape `in` (channels, rows, cols) to
// the rows and cols of `out`: a residual block's projection. 0 when none does.
int64_t ProjectionStride(const std::vector<int64_t>& in, const std::vector<int64_t>& out);

// The built-in models as the layers they are: "cnn" (conv 3x3 -> max-pool 2 -> ReLU twice, then
// two linear layers: conv1, conv2, fc1, fc2), "resnet18" and "resnet50" (torchvision's, its
// parameter names: conv1, bn1, layer1.0.conv1, layer1.0.downsample.0, fc); nullopt for another.
std::optional<std::vector<LayerSpec>> BuiltinLayers(const std::string& model);

// Names every layer that holds parameters and has no name, as PyTorch users name them: conv1,
// conv2, bn1, fc1, ... in order, each kind counted apart; a residual block is block1, block2, ...
// and its body's layers are named inside it ("block1.conv1"), its projection "block1.downsample"
// (".0" the convolution, ".1" the batch norm), as torchvision's ResNets name theirs.
void NameLayers(std::vector<LayerSpec>* layers);

// A row of the layer table: a layer and the shape it outputs.
struct LayerRow {
  std::string index;           // "3", or "4.1" for the second layer of the residual block at 4
  std::string name;            // its parameters' prefix, "" for a layer without parameters
  std::string what;            // "conv 3x3 /2 pad 1, 48"
  std::vector<int64_t> shape;  // channels x rows x cols, or features
  int64_t params = 0;
};
struct ModelSummary {
  std::vector<LayerRow> rows;
  int64_t params = 0;
  double activations = 0;  // every layer's outputs for one image, summed: what training keeps for backward
};

// Follows `input` (channels, rows, cols) through named layers (NameLayers) and checks each
// fits: a mismatch is kInvalidArgument naming the layer's index, origin, kind and both shapes,
// and the output must be `classes` features (`classes` 0: not known yet, as for an image folder
// before it is read; the last linear layer's size is then left open).
Result<ModelSummary> SummarizeModel(const std::vector<LayerSpec>& layers, const std::vector<int64_t>& input,
                                    int classes);
// Keras's summary(): one row per layer with its output shape and parameters, then the total.
std::string FormatSummary(const ModelSummary& summary);
// "1x28x28", "10".
std::string ShapeText(const std::vector<int64_t>& shape);

}  // namespace trainctl
