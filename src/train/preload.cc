// A worker server's preload (train/entry.h): the data, and one warm-up step of the model.
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/nn/functional/loss.h>

#include "common/duration.h"
#include "common/log.h"
#include "train/batches.h"
#include "train/entry.h"
#include "train/trainer.h"

namespace trainctl::train {
namespace {

// One forward and backward of the spec's model on a batch of zeros shaped as a worker's, in a
// worker server before it makes copies: what LibTorch and oneDNN make on first use (oneDNN's
// primitives and the kernels it generates for them, the dispatcher's caches) is then made once,
// and each copy finds it made. Nothing here may start a thread (the server would then refuse to
// serve): one compute thread, the CPU only, and no backward where LibTorch has a GPU backend
// (its autograd engine starts a thread per GPU at the first backward). The copies reseed. On the
// 2-core VM the example's first step in a copy took 45-59 ms instead of 124-152.
bool WarmUp(const JobSpec& spec, const data::ImageSet& set) {
  const TrainerSpec& t = spec.trainer;
  // A TorchScript module is loaded by each worker: its interpreter is not warmed here.
  if (t.device == "cuda" || set.count < 1 || t.model == "torchscript") return false;
  bool accelerator = false;
  for (int type = 0; type < static_cast<int>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES); ++type) {
    const auto d = static_cast<c10::DeviceType>(type);
    const bool cpu_queue = d == c10::DeviceType::CPU || d == c10::DeviceType::Meta || d == c10::DeviceType::Lazy;
    if (!cpu_queue && c10::impl::hasDeviceGuardImpl(d)) accelerator = true;
  }
  const int classes = t.data.dataset == "synthetic" ? t.data.classes : set.num_classes;
  const int64_t batch = WorkerBatch(t, std::max(1, TrainingWorkers(spec)));
  if (batch < 1) return false;  // the workers refuse such a spec
  // The primitives are made for the batch's shape (a batch of 1 or 8 saved half as much), so the
  // step is a worker's whole step, made before any copy starts: for large inputs (ImageNet's) it
  // would hold the first copies back longer than their first steps gain.
  constexpr int64_t kMaxPixels = int64_t{1} << 20;
  if (batch * set.image_bytes() > kMaxPixels) return false;
  try {
    at::set_num_threads(1);
    auto model = models::MakeModel(t.model, {set.channels, set.rows, set.cols, classes}, t.layers);
    if (!model.ok()) return false;
    (*model)->train();
    torch::Tensor x = torch::zeros({batch, set.channels, set.rows, set.cols});
    if (t.memory_format == "channels_last") x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    torch::Tensor logits;
    {
      Autocast autocast(t.precision == "bf16", torch::Device(torch::kCPU));
      logits = (*model)->forward(x);
    }
    if (!accelerator) {
      torch::nn::functional::cross_entropy(logits.to(torch::kFloat32), torch::zeros({batch}, torch::kLong)).backward();
    }
  } catch (const std::exception& e) {
    // Nothing is lost: each copy makes what it needs on first use, as an exec'd worker does.
    LOG_DEBUG("worker server: the warm-up step failed: {}", e.what());
    return false;
  }
  return true;
}

}  // namespace

namespace {
std::optional<JobSpec>& Preloaded() {
  static std::optional<JobSpec> spec;
  return spec;
}
}  // namespace

const JobSpec* PreloadedSpec() { return Preloaded() ? &*Preloaded() : nullptr; }

int RunPreload(const PreloadOptions& options) {
  log::SetLevel(options.log_level);
  if (!options.spec || !options.splits) return 0;
  Preloaded() = *options.spec;
  const JobSpec* spec = &*Preloaded();
  const data::ImageSet* train = KeepSplits(std::move(*options.splits));
  if (!train) {
    LOG_DEBUG("worker server: the training set did not load; each worker will read it and say why");
    return 0;
  }
  const double load_seconds = options.load_seconds;
  const auto loaded = Clock::now();
  const bool warmed = WarmUp(*spec, *train);
  LOG_DEBUG("worker server: the data ({} training images) loaded in {:.3f} s; {}", train->count, load_seconds,
            warmed ? fmt::format("a warm-up step of {} in {:.3f} s", spec->trainer.model, SecondsSince(loaded))
                   : std::string("no warm-up step"));
  return 0;
}

}  // namespace trainctl::train
