// The example CNN's two layers, each relu(max_pool2d(conv3x3(x), 2)) at a batch of 64 on one
// thread: ATen's convolution (oneDNN's direct kernels on a CPU without AVX-512) followed by the
// trainer's pooling (kernels::MaxPool2x2Relu), against the trainer's fused layers
// (kernels::ImageConvPoolRelu for the image's 1 -> 32, kernels::ConvPoolRelu, Winograd, for
// 32 -> 64) and, for 32 -> 64 on a CPU with AVX-512, oneDNN's own blocked kernels
// (kernels::Conv3x3, Winograd where oneDNN picks it; in bf16 too on a CPU with bf16 instructions)
// followed by the pooling in that layout; forward and backward, each the median of --reps calls;
// the first linear layer, ATen's (OpenBLAS) against oneDNN's sgemm, which the CNN uses; then the
// whole CNN's step (forward, cross-entropy, backward) as the trainer runs it on this CPU, and its
// optimizer's step against torch.optim.SGD's. Built on demand: cmake --build build --target conv_layer; pin it with
// taskset.
//   build/src/conv_layer [reps, default 50] [batch, default 64]
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "kernels/ops.h"
#include "models/models.h"
#if TRAINCTL_HAVE_ONEDNN
#include "kernels/onednn.h"
#endif
#include "train/optimizer.h"

namespace {

using Layer = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

constexpr int kWarmUp = 3;  // calls before the timed ones

double Median(std::vector<double> ms) {
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

// Median forward and backward milliseconds of `forward` (then backward with g, or of the loss it
// returns) over `reps` calls; the leaves' gradients are dropped after each.
std::pair<double, double> TimeCalls(int reps, const std::function<torch::Tensor()>& forward, const torch::Tensor& g,
                                    std::vector<torch::Tensor> leaves) {
  std::vector<double> fwd, bwd;
  for (int r = 0; r < kWarmUp + reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    torch::Tensor y = forward();
    auto t1 = std::chrono::steady_clock::now();
    if (y.dim() == 0) {
      y.backward();  // a loss
    } else {
      y.backward(g);
    }
    auto t2 = std::chrono::steady_clock::now();
    for (torch::Tensor& t : leaves) {
      if (t.requires_grad()) t.mutable_grad().reset();
    }
    if (r >= kWarmUp) {
      fwd.push_back(Ms(t1 - t0));
      bwd.push_back(Ms(t2 - t1));
    }
  }
  return {Median(fwd), Median(bwd)};
}

// The same for `layer`, for `in` -> `out` channels on `size` x `size`; the input takes a gradient
// unless it is the image.
std::pair<double, double> Time(const Layer& layer, int reps, int64_t batch, int64_t in, int64_t out, int64_t size) {
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({batch, in, size, size}).requires_grad_(in > 3);
  torch::Tensor w = (torch::randn({out, in, 3, 3}) * 0.1).requires_grad_(true);
  torch::Tensor b = torch::randn({out}).requires_grad_(true);
  torch::Tensor g = torch::randn({batch, out, size / 2, size / 2});
  // As the model passes it: the first layer's output is channels-last.
  if (in > 3) x = x.detach().contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true);
  return TimeCalls(reps, [&] { return layer(x, w, b); }, g, {x, w, b});
}

// The same for a linear layer `layer` of `in` -> `out` features.
std::pair<double, double> TimeLinear(const Layer& layer, int reps, int64_t batch, int64_t in, int64_t out) {
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({batch, in}).requires_grad_(true);
  torch::Tensor w = (torch::randn({out, in}) * 0.02).requires_grad_(true), b = torch::randn({out}).requires_grad_(true);
  return TimeCalls(reps, [&] { return layer(x, w, b); }, torch::randn({batch, out}), {x, w, b});
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  const int64_t batch = argc > 2 ? std::atoll(argv[2]) : 64;
  at::set_num_threads(1);
  const Layer aten = [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
    return trainctl::kernels::MaxPool2x2Relu(torch::conv2d(x, w, b, 1, 1));
  };
  std::printf("batch %lld, one thread, median of %d (Winograd kernels: %s)\n", static_cast<long long>(batch), reps,
              trainctl::kernels::WinogradConvolutions() ? "yes" : "no, ATen's");
  std::printf("%-34s %10s %11s %10s %12s\n", "", "forward ms", "backward ms", "total ms", "GFLOP/s");
  struct Case {
    const char* name;
    Layer ours;
    int64_t in, out, size, passes;  // passes: forward, the weight's gradient, the input's if it takes one
  };
  // The fused layers with their ReLU (the kernels' relu argument, true in the CNN).
  const Layer image = [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
    return trainctl::kernels::ImageConvPoolRelu(x, w, b, true);
  };
  const Layer hidden = [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
    return trainctl::kernels::ConvPoolRelu(x, w, b, true);
  };
  for (const Case& c :
       {Case{"1 -> 32 on 28 x 28", image, 1, 32, 28, 2}, Case{"32 -> 64 on 14 x 14", hidden, 32, 64, 14, 3}}) {
    // Direct-convolution FLOP of the passes.
    const double flop = c.passes * 2.0 * batch * c.out * c.in * 9 * c.size * c.size;
    const auto theirs = Time(aten, reps, batch, c.in, c.out, c.size);
    const auto ours = Time(c.ours, reps, batch, c.in, c.out, c.size);
    std::vector<std::pair<const char*, std::pair<double, double>>> rows = {{"ATen conv + MaxPool2x2Relu", theirs},
                                                                           {"trainctl fused", ours}};
#if TRAINCTL_HAVE_ONEDNN
    if (trainctl::kernels::BlockedConvolutions() && c.in >= trainctl::kernels::kBlock) {
      const auto blocked = [](bool bf16) -> Layer {
        return [bf16](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
          using namespace trainctl::kernels;
          return FromBlocked(MaxPool2x2Relu(Conv3x3(ToBlocked(x), w, b, bf16)));
        };
      };
      rows.emplace_back("oneDNN blocked", Time(blocked(false), reps, batch, c.in, c.out, c.size));
      if (trainctl::kernels::Bf16Convolutions()) {
        rows.emplace_back("oneDNN blocked bf16", Time(blocked(true), reps, batch, c.in, c.out, c.size));
      }
    }
#endif
    for (auto [name, t] : rows) {
      std::printf("%-20s %-13s %10.2f %11.2f %10.2f %12.1f\n", c.name, name, t.first, t.second, t.first + t.second,
                  flop / (t.first + t.second) / 1e6);
    }
    std::printf("%-20s fused / ATen: %.3fx the time\n", c.name,
                (ours.first + ours.second) / (theirs.first + theirs.second));
  }
  // The first linear layer, 3136 -> 128: ATen's (OpenBLAS) and, where it is built in, oneDNN's
  // sgemm (kernels::Linear), which the CNN runs on the CPU.
  std::vector<std::pair<const char*, Layer>> linears = {
      {"ATen",
       [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) { return torch::linear(x, w, b); }}};
#if TRAINCTL_HAVE_ONEDNN
  linears.emplace_back("oneDNN", trainctl::kernels::Linear);
#endif
  constexpr int64_t kFeatures = 64 * 7 * 7, kHidden = 128;  // fc1's
  const double linear_flop = 3 * 2.0 * batch * kFeatures * kHidden;
  for (const auto& [name, layer] : linears) {
    const auto t = TimeLinear(layer, reps, batch, kFeatures, kHidden);
    std::printf("linear %lld -> %lld  %-13s %10.2f %11.2f %10.2f %12.1f\n", static_cast<long long>(kFeatures),
                static_cast<long long>(kHidden), name, t.first, t.second, t.first + t.second,
                linear_flop / (t.first + t.second) / 1e6);
  }
  auto model = trainctl::models::MakeModel("cnn", {});
  if (!model.ok()) return 1;
  torch::Tensor images = torch::randn({batch, 1, 28, 28}), labels = torch::randint(0, 10, {batch});
  const auto t = TimeCalls(
      reps, [&] { return torch::cross_entropy_loss((*model)->forward(images), labels); }, torch::Tensor(),
      (*model)->parameters());
  std::printf("the CNN's step (forward, loss, backward): %.2f + %.2f = %.2f ms, %.0f samples/s\n", t.first, t.second,
              t.first + t.second, batch / (t.first + t.second) * 1e3);

  // The optimizer's step over the CNN's parameters (the example's SGD: momentum, Nesterov, weight
  // decay; flat buffers as the trainer's): the trainer's one pass against torch.optim.SGD's five
  // ATen operations on the same flat tensor.
  int64_t count = 0;
  for (const auto& p : (*model)->parameters()) count += p.numel();
  trainctl::OptimizerSpec spec;
  spec.name = "sgd";
  spec.lr = 0.1;
  spec.momentum = 0.9;
  spec.nesterov = true;
  spec.weight_decay = 5e-4;
  torch::Tensor params = torch::randn({count}), grads = torch::randn({count});
  torch::Tensor theirs = params.clone().requires_grad_(true);
  theirs.mutable_grad() = grads.clone();
  trainctl::train::Optimizer ours(spec, params, grads);
  torch::optim::SGD reference(
      {theirs},
      torch::optim::SGDOptions(spec.lr).momentum(spec.momentum).nesterov(true).weight_decay(spec.weight_decay));
  auto median_ms = [&](const std::function<void()>& fn) {
    std::vector<double> ms;
    for (int r = 0; r < kWarmUp + reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      fn();
      if (r >= kWarmUp) ms.push_back(Ms(std::chrono::steady_clock::now() - t0));
    }
    return Median(ms);
  };
  const double ours_ms = median_ms([&] { ours.Step(spec.lr); });
  const double theirs_ms = median_ms([&] { reference.step(); });
  std::printf(
      "the optimizer's step (SGD, %lld parameters): trainctl %.3f ms, torch.optim.SGD %.3f ms: %.3fx the time\n",
      static_cast<long long>(count), ours_ms, theirs_ms, ours_ms / theirs_ms);
  return 0;
}
