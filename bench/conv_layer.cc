// The example CNN's 32 -> 64 convolution (3x3, padding 1, on 14 x 14) at a batch of 64, one
// thread: ATen's (torch::conv2d; oneDNN's direct kernels on a CPU without AVX-512) against the
// trainer's Winograd (models::Conv3x3Winograd), forward and backward, each the median of --reps
// calls. Built on demand: cmake --build build --target conv_layer; pin it with taskset.
//   build/src/conv_layer [reps, default 50] [batch, default 64]
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "models/ops.h"

namespace {

using Conv = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Median forward and backward milliseconds of `conv` over `reps` calls.
std::pair<double, double> Time(const Conv& conv, int reps, int64_t batch) {
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({batch, 32, 14, 14}).requires_grad_(true);
  torch::Tensor w = (torch::randn({64, 32, 3, 3}) * 0.1).requires_grad_(true);
  torch::Tensor b = torch::randn({64}).requires_grad_(true);
  torch::Tensor g = torch::randn({batch, 64, 14, 14});
  std::vector<double> fwd, bwd;
  for (int r = 0; r < reps + 3; ++r) {  // the first three warm up
    auto t0 = std::chrono::steady_clock::now();
    torch::Tensor y = conv(x, w, b);
    auto t1 = std::chrono::steady_clock::now();
    y.backward(g);
    auto t2 = std::chrono::steady_clock::now();
    x.mutable_grad().reset();
    w.mutable_grad().reset();
    b.mutable_grad().reset();
    if (r >= 3) {
      fwd.push_back(Ms(t1 - t0));
      bwd.push_back(Ms(t2 - t1));
    }
  }
  std::sort(fwd.begin(), fwd.end());
  std::sort(bwd.begin(), bwd.end());
  return {fwd[fwd.size() / 2], bwd[bwd.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  const int64_t batch = argc > 2 ? std::atoll(argv[2]) : 64;
  at::set_num_threads(1);
  // Direct-convolution FLOP of a pass (forward, or each of backward's two gradients).
  const double flop = 2.0 * batch * 64 * 32 * 9 * 14 * 14;
  auto aten = Time([](const torch::Tensor& x, const torch::Tensor& w,
                      const torch::Tensor& b) { return torch::conv2d(x, w, b, 1, 1); },
                   reps, batch);
  auto ours = Time(trainctl::models::Conv3x3Winograd, reps, batch);
  std::printf("32 -> 64 channels, 14 x 14, batch %lld, one thread, median of %d (Winograd kernels: %s)\n",
              static_cast<long long>(batch), reps, trainctl::models::WinogradConvolutions() ? "yes" : "no, ATen's");
  std::printf("%-12s %10s %10s %10s %26s\n", "", "forward ms", "backward ms", "total ms", "direct-count GFLOP/s");
  for (auto [name, t] : {std::pair{"ATen", aten}, std::pair{"Winograd", ours}}) {
    std::printf("%-12s %10.2f %11.2f %10.2f %26.1f\n", name, t.first, t.second, t.first + t.second,
                3 * flop / (t.first + t.second) / 1e6);
  }
  std::printf("Winograd / ATen: %.3fx the time\n", (ours.first + ours.second) / (aten.first + aten.second));
  return 0;
}
