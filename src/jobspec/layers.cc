#include "jobspec/layers.h"

#include <array>
#include <cstdio>
#include <map>

#include "common/strings.h"

namespace trainctl {
namespace {

using Kind = LayerSpec::Kind;

struct KindName {
  Kind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {Kind::kConv, "conv"},
    {Kind::kBatchNorm, "batchnorm"},
    {Kind::kRelu, "relu"},
    {Kind::kGelu, "gelu"},
    {Kind::kMaxPool, "maxpool"},
    {Kind::kAvgPool, "avgpool"},
    {Kind::kGlobalAvgPool, "global_avgpool"},
    {Kind::kFlatten, "flatten"},
    {Kind::kLinear, "linear"},
    {Kind::kDropout, "dropout"},
    {Kind::kResidual, "residual"},
};

std::string Window(const LayerSpec& l) {
  std::string s = std::to_string(l.kernel) + "x" + std::to_string(l.kernel);
  // A pool's stride is its kernel unless the spec says otherwise; a convolution's is 1.
  if (l.stride != (l.kind == Kind::kConv ? 1 : l.kernel)) s += " /" + std::to_string(l.stride);
  if (l.padding) s += " pad " + std::to_string(l.padding);
  return s;
}

std::string Describe(const LayerSpec& l) {
  switch (l.kind) {
    case Kind::kConv: {
      std::string s = "conv " + Window(l) + ", " + std::to_string(l.out);
      if (l.groups != 1) s += ", groups " + std::to_string(l.groups);
      if (!l.bias) s += ", no bias";
      return s;
    }
    case Kind::kMaxPool:
    case Kind::kAvgPool:
      return std::string(LayerKindName(l.kind)) + " " + Window(l);
    case Kind::kLinear:
      return "linear, " + (l.out > 0 ? std::to_string(l.out) : std::string("the classes")) +
             (l.bias ? "" : ", no bias");
    case Kind::kDropout: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "dropout %g", l.p);
      return buf;
    }
    case Kind::kResidual:
      return "residual (" + std::to_string(l.body.size()) + " layers)";
    default:
      return LayerKindName(l.kind);
  }
}

class Summarizer {
 public:
  explicit Summarizer(int classes) : classes_(classes) {}
  ModelSummary summary;

  // Follows `shape` through `layers`; `prefix` numbers a residual block's body ("4.").
  Status Follow(const std::vector<LayerSpec>& layers, const std::string& prefix, std::vector<int64_t>* shape,
                bool top) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerSpec l = WithDefaults(layers[i]);
      const std::string index = prefix + std::to_string(i);
      // A linear layer without a size is the classifier: the last of the model.
      const bool last = top && i + 1 == layers.size();
      RETURN_IF_ERROR(Apply(l, index, last, shape));
    }
    return Status::Ok();
  }

 private:
  Status Bad(const LayerSpec& l, const std::string& index, const std::vector<int64_t>& in, const std::string& why) {
    return InvalidArgument((l.origin.empty() ? "" : l.origin + ": ") + "trainer.model.layers[" + index + "] (" +
                           LayerKindName(l.kind) + "): " + why + "; its input is " + ShapeText(in));
  }

  void Row(const LayerSpec& l, const std::string& index, const std::vector<int64_t>& shape, int64_t params,
           const std::string& name) {
    summary.rows.push_back({index, params > 0 ? name : "", Describe(l), shape, params});
    summary.params += params;
    double outputs = 1;
    for (int64_t d : shape) outputs *= static_cast<double>(d);
    summary.activations += outputs;
  }

  Status Apply(const LayerSpec& l, const std::string& index, bool last, std::vector<int64_t>* shape) {
    const std::vector<int64_t> in = *shape;
    const bool image = in.size() == 3;
    switch (l.kind) {
      case Kind::kConv:
      case Kind::kMaxPool:
      case Kind::kAvgPool:
        return ApplyWindow(l, index, shape);
      case Kind::kGlobalAvgPool:
        if (!image) return Bad(l, index, in, "expected an image (channels x rows x cols); put it before flatten");
        *shape = {in[0], 1, 1};
        Row(l, index, *shape, 0, "");
        return Status::Ok();
      case Kind::kFlatten: {
        int64_t n = 1;
        for (int64_t d : in) n *= d;
        *shape = {n};
        Row(l, index, *shape, 0, "");
        return Status::Ok();
      }
      case Kind::kBatchNorm:
        Row(l, index, in, 2 * in[0], l.name);
        return Status::Ok();
      case Kind::kRelu:
      case Kind::kGelu:
      case Kind::kDropout:
        if (l.kind == Kind::kDropout && !(l.p >= 0 && l.p < 1)) return Bad(l, index, in, "p must be from 0 to below 1");
        Row(l, index, in, 0, "");
        return Status::Ok();
      case Kind::kLinear:
        return ApplyLinear(l, index, last, shape);
      case Kind::kResidual:
        return ApplyResidual(l, index, shape);
    }
    return Bad(l, index, in, "unknown layer");
  }

  // A convolution or a pooling: a window slid over the image.
  Status ApplyWindow(const LayerSpec& l, const std::string& index, std::vector<int64_t>* shape) {
    const std::vector<int64_t> in = *shape;
    const bool image = in.size() == 3;
    if (!image) return Bad(l, index, in, "expected an image (channels x rows x cols); put it before flatten");
    if (l.kernel < 1 || l.stride < 1 || l.padding < 0) return Bad(l, index, in, "kernel and stride must be at least 1");
    if (l.kind != Kind::kConv && 2 * l.padding > l.kernel) {
      return Bad(l, index, in,
                 "padding " + std::to_string(l.padding) + " is more than half the kernel " + std::to_string(l.kernel) +
                     " (PyTorch refuses it)");
    }
    const int64_t rows = SlideWindow(in[1], l.kernel, l.stride, l.padding);
    const int64_t cols = SlideWindow(in[2], l.kernel, l.stride, l.padding);
    if (rows < 1 || cols < 1) {
      return Bad(l, index, in,
                 "a " + Window(l) + " window does not fit in " + std::to_string(in[1]) + "x" + std::to_string(in[2]) +
                     " pixels");
    }
    int64_t params = 0, channels = in[0];
    if (l.kind == Kind::kConv) {
      if (l.out < 1) return Bad(l, index, in, "expected channels, the number of output channels");
      if (in[0] % l.groups != 0 || l.out % l.groups != 0) {
        return Bad(l, index, in,
                   "groups " + std::to_string(l.groups) + " must divide the input's " + std::to_string(in[0]) +
                       " and the output's " + std::to_string(l.out) + " channels");
      }
      channels = l.out;
      params = l.out * (in[0] / l.groups) * l.kernel * l.kernel + (l.bias ? l.out : 0);
    }
    *shape = {channels, rows, cols};
    Row(l, index, *shape, params, l.name);
    return Status::Ok();
  }

  Status ApplyLinear(const LayerSpec& l, const std::string& index, bool last, std::vector<int64_t>* shape) {
    const std::vector<int64_t> in = *shape;
    const bool image = in.size() == 3;
    if (image) {
      return Bad(l, index, in,
                 "expected features, not an image; put flatten (or global_avgpool, flatten) "
                 "before it");
    }
    int64_t out = l.out;
    if (out == 0) {
      if (!last)
        return Bad(l, index, in,
                   "expected features, the number of outputs (only the last layer "
                   "may leave it out: it outputs the classes)");
      out = classes_;
    }
    *shape = {out};
    LayerSpec sized = l;
    sized.out = out;
    Row(sized, index, *shape, in[0] * out + (l.bias ? out : 0), l.name);
    return Status::Ok();
  }

  // A block whose output is its body's plus its input (projected when their shapes differ).
  Status ApplyResidual(const LayerSpec& l, const std::string& index, std::vector<int64_t>* shape) {
    const std::vector<int64_t> in = *shape;
    const bool image = in.size() == 3;
    if (l.body.empty()) return Bad(l, index, in, "expected layers, the block's body");
    std::vector<int64_t> out = in;
    const size_t row = summary.rows.size();
    Row(l, index, in, 0, "");  // its output shape and parameters are known after its body
    RETURN_IF_ERROR(Follow(l.body, index + ".", &out, false));
    int64_t params = 0;
    for (size_t r = row + 1; r < summary.rows.size(); ++r) params += summary.rows[r].params;
    if (l.projection == "conv" || (l.projection == "auto" && out != in)) {
      if (!image || out.size() != 3) {
        return Bad(l, index, in, "a projection needs an image in and out; the body outputs " + ShapeText(out));
      }
      // A 1x1 convolution with the stride that takes the input's size to the body's.
      const int64_t stride = ProjectionStride(in, out);
      if (!stride) {
        return Bad(l, index, in, "no 1x1 projection with a stride takes it to the body's output " + ShapeText(out));
      }
      const int64_t projection = in[0] * out[0] + 2 * out[0];
      summary.rows.push_back({index + ".downsample", l.name + ".downsample",
                              "projection: conv 1x1" + (stride > 1 ? " /" + std::to_string(stride) : std::string()) +
                                  ", " + std::to_string(out[0]) + "; batchnorm",
                              out, projection});
      summary.params += projection;
      params += projection;
    } else if (out != in) {
      return Bad(l, index, in,
                 "its body outputs " + ShapeText(out) +
                     ", which cannot be added to its input; "
                     "expected projection: auto or conv");
    }
    summary.rows[row].shape = out;
    summary.rows[row].what += params ? ", " + std::to_string(params) + " parameters" : "";
    *shape = out;
    return Status::Ok();
  }

  int classes_;
};

void Name(std::vector<LayerSpec>* layers, const std::string& prefix) {
  std::map<Kind, int> counts;
  for (LayerSpec& l : *layers) {
    const int n = ++counts[l.kind];
    if (l.name.empty()) {
      switch (l.kind) {
        case Kind::kConv:
          l.name = prefix + "conv" + std::to_string(n);
          break;
        case Kind::kBatchNorm:
          l.name = prefix + "bn" + std::to_string(n);
          break;
        case Kind::kLinear:
          l.name = prefix + "fc" + std::to_string(n);
          break;
        case Kind::kResidual:
          l.name = prefix + "block" + std::to_string(n);
          break;
        default:
          break;
      }
    }
    if (l.kind == Kind::kResidual) Name(&l.body, l.name + ".");
  }
}

}  // namespace

const char* LayerKindName(LayerSpec::Kind kind) {
  for (const auto& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

std::optional<LayerSpec::Kind> LayerKindFromName(const std::string& name) {
  for (const auto& k : kKinds) {
    if (name == k.name) return k.kind;
  }
  return std::nullopt;
}

std::vector<std::string> LayerKindNames() {
  std::vector<std::string> out;
  for (const auto& k : kKinds) out.push_back(k.name);
  return out;
}

LayerSpec WithDefaults(LayerSpec l) {
  if (l.kind == Kind::kConv) {
    if (l.kernel == 0) l.kernel = 3;
    if (l.stride == 0) l.stride = 1;
  } else if (l.kind == Kind::kMaxPool || l.kind == Kind::kAvgPool) {
    if (l.kernel == 0) l.kernel = 2;
    if (l.stride == 0) l.stride = l.kernel;
  }
  return l;
}

namespace {

LayerSpec Make(Kind kind, std::string name = "") {
  LayerSpec l;
  l.kind = kind;
  l.name = std::move(name);
  return l;
}

LayerSpec MakeConv(std::string name, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool bias) {
  LayerSpec l = Make(Kind::kConv, std::move(name));
  l.out = out;
  l.kernel = kernel;
  l.stride = stride;
  l.padding = padding;
  l.bias = bias;
  return l;
}

LayerSpec MakeMaxPool(int64_t kernel, int64_t stride, int64_t padding) {
  LayerSpec l = Make(Kind::kMaxPool);
  l.kernel = kernel;
  l.stride = stride;
  l.padding = padding;
  return l;
}

LayerSpec MakeLinear(std::string name, int64_t out) {  // out 0: the data's classes
  LayerSpec l = Make(Kind::kLinear, std::move(name));
  l.out = out;
  return l;
}

// The example CNN: conv 3x3 -> max-pool 2 -> ReLU, twice, then two linear layers (its parameters
// conv1, conv2, fc1, fc2). Pooling before the ReLU gives the same result as after it on a quarter
// of the elements; the declared model runs each conv+pool+relu as one pass of its own kernels.
std::vector<LayerSpec> CnnLayers() {
  return {MakeConv("conv1", 32, 3, 1, 1, true),
          MakeMaxPool(2, 2, 0),
          Make(Kind::kRelu),
          MakeConv("conv2", 64, 3, 1, 1, true),
          MakeMaxPool(2, 2, 0),
          Make(Kind::kRelu),
          Make(Kind::kFlatten),
          MakeLinear("fc1", 128),
          Make(Kind::kRelu),
          MakeLinear("fc2", 0)};
}

// torchvision's ResNets, their parameters named as torchvision names them (conv1, bn1,
// layer1.0.conv1, layer1.0.downsample.0, fc): BasicBlock (ResNet-18/34) or Bottleneck (ResNet-50,
// the stride on its 3x3 convolution), each block a residual whose projection (a 1x1 convolution
// and batch norm) is where it changes the shape, then a ReLU.
std::vector<LayerSpec> ResNetLayers(std::array<int, 4> blocks, bool bottleneck) {
  std::vector<LayerSpec> out = {MakeConv("conv1", 64, 7, 2, 3, false), Make(Kind::kBatchNorm, "bn1"), Make(Kind::kRelu),
                                MakeMaxPool(3, 2, 1)};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t width = 64 << stage;
    for (int b = 0; b < blocks[stage]; ++b) {
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      LayerSpec block = Make(Kind::kResidual, "layer" + std::to_string(stage + 1) + "." + std::to_string(b));
      auto conv = [&](int i, int64_t channels, int64_t kernel, int64_t s) {
        const std::string n = block.name + ".conv" + std::to_string(i);
        block.body.push_back(MakeConv(n, channels, kernel, s, kernel / 2, false));
        block.body.push_back(Make(Kind::kBatchNorm, block.name + ".bn" + std::to_string(i)));
      };
      if (bottleneck) {
        conv(1, width, 1, 1);
        block.body.push_back(Make(Kind::kRelu));
        conv(2, width, 3, stride);
        block.body.push_back(Make(Kind::kRelu));
        conv(3, width * 4, 1, 1);
      } else {
        conv(1, width, 3, stride);
        block.body.push_back(Make(Kind::kRelu));
        conv(2, width, 3, 1);
      }
      out.push_back(std::move(block));
      out.push_back(Make(Kind::kRelu));
    }
  }
  for (auto l : {Make(Kind::kGlobalAvgPool), Make(Kind::kFlatten), MakeLinear("fc", 0)}) out.push_back(l);
  return out;
}

}  // namespace

std::optional<std::vector<LayerSpec>> BuiltinLayers(const std::string& name) {
  if (name == "cnn") return CnnLayers();
  if (name == "resnet18") return ResNetLayers({2, 2, 2, 2}, false);
  if (name == "resnet50") return ResNetLayers({3, 4, 6, 3}, true);
  return std::nullopt;
}

int64_t SlideWindow(int64_t size, int64_t kernel, int64_t stride, int64_t padding) {
  return (size + 2 * padding - kernel) / stride + 1 - ((size + 2 * padding - kernel) < 0 ? 1 : 0);
}

int64_t ProjectionStride(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  if (in.size() != 3 || out.size() != 3) return 0;
  for (int64_t s = 1; s <= std::max(in[1], in[2]); ++s) {
    if (SlideWindow(in[1], 1, s, 0) == out[1] && SlideWindow(in[2], 1, s, 0) == out[2]) return s;
  }
  return 0;
}

void NameLayers(std::vector<LayerSpec>* layers) { Name(layers, ""); }

Result<ModelSummary> SummarizeModel(const std::vector<LayerSpec>& layers, const std::vector<int64_t>& input,
                                    int classes) {
  if (layers.empty()) return InvalidArgument("trainer.model.layers: expected at least one layer");
  Summarizer s(classes);
  std::vector<int64_t> shape = input;
  RETURN_IF_ERROR(s.Follow(layers, "", &shape, true));
  if (classes > 0 ? shape != std::vector<int64_t>{classes} : shape.size() != 1) {
    const LayerSpec& l = layers.back();
    return InvalidArgument((l.origin.empty() ? "" : l.origin + ": ") + "trainer.model.layers: the model outputs " +
                           ShapeText(shape) + ", expected the " + std::to_string(classes) +
                           " classes' scores; end it with flatten and linear (its size left out: the classes)");
  }
  return std::move(s.summary);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

std::string FormatSummary(const ModelSummary& summary) {
  auto grouped = [](int64_t n) {
    std::string s = std::to_string(n);
    for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
    return s;
  };
  size_t wi = 1, wn = 4, ww = 5, ws = 6;
  for (const auto& r : summary.rows) {
    wi = std::max(wi, r.index.size());
    wn = std::max(wn, r.name.size());
    ww = std::max(ww, r.what.size());
    ws = std::max(ws, ShapeText(r.shape).size());
  }
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "  %-*s  %-*s  %-*s  %-*s  %12s\n", int(wi), "#", int(wn), "name", int(ww), "layer",
                int(ws), "output", "parameters");
  out += line;
  for (const auto& r : summary.rows) {
    std::snprintf(line, sizeof line, "  %-*s  %-*s  %-*s  %-*s  %12s\n", int(wi), r.index.c_str(), int(wn),
                  r.name.c_str(), int(ww), r.what.c_str(), int(ws), ShapeText(r.shape).c_str(),
                  r.params ? grouped(r.params).c_str() : "");
    std::string row = line;
    while (row.size() > 1 && row[row.size() - 2] == ' ') row.erase(row.size() - 2, 1);
    out += row;
  }
  out += "  total parameters: " + grouped(summary.params) + "\n";
  return out;
}

}  // namespace trainctl
