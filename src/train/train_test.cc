// Unit tests of the trainer's LibTorch parts: the optimizers against PyTorch's own
// (torch::optim), and the gradient reducer against plain backward, on one rank and on two.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <array>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "comm/communicator.h"
#include "common/cpus.h"
#include "jobspec/job_spec.h"
#include "models/models.h"
#include "store/memory/memory_store.h"
#include "tests/test_util.h"
#include "train/optimizer.h"
#include "train/reducer.h"
#include "train/schedule.h"
#include "train/torch_data.h"

namespace trainctl::train {
namespace {

// Runs our optimizer and torch::optim's on the same parameters and gradients.
void CompareWithTorch(const OptimizerSpec& spec,
                      std::unique_ptr<torch::optim::Optimizer> (*make)(std::vector<torch::Tensor>,
                                                                       const OptimizerSpec&),
                      int64_t size = 1000, bool bitwise = false) {
  torch::manual_seed(1);
  torch::Tensor ours = torch::randn({size});
  torch::Tensor theirs = ours.clone().requires_grad_(true);
  torch::Tensor grads = torch::zeros({size});
  Optimizer opt(spec, ours, grads);
  auto ref = make({theirs}, spec);
  for (int step = 0; step < 5; ++step) {
    torch::Tensor g = torch::randn({size});
    grads.copy_(g);
    theirs.mutable_grad() = g.clone();
    opt.Step(spec.lr);
    ref->step();
  }
  EXPECT_TRUE(torch::allclose(ours, theirs.detach(), 1e-6, 1e-6)) << (ours - theirs.detach()).abs().max().item<float>();
  if (bitwise) {
    EXPECT_TRUE(torch::equal(ours, theirs.detach())) << (ours - theirs.detach()).abs().max().item<float>();
  }
}

// trainer.data.augment: each image shifted by at most crop_padding pixels (black coming in) and
// mirrored half the time, the same for the same (seed, epoch, image), other in another epoch.
TEST(Data, AugmentationShiftsAndMirrorsEachImageAsItsHashSays) {
  data::ImageSet set;
  set.count = 64, set.channels = 1, set.rows = 6, set.cols = 5, set.num_classes = 2;
  for (int64_t i = 0; i < set.count; ++i) {
    for (int k = 0; k < 30; ++k) set.pixels.push_back(static_cast<uint8_t>(1 + (i * 30 + k) % 250));
    set.labels.push_back(static_cast<uint8_t>(i % 2));
  }
  const Normalizer norm{{0.0f}, {1.0f / 255.0f}};  // the batch's values are the pixels themselves
  std::vector<int64_t> idx(64);
  for (int64_t i = 0; i < 64; ++i) idx[i] = i;
  Augment a{2, true, 7, 0};
  torch::Tensor x, y, x2, y2, x3, y3;
  ASSERT_TRUE(FillBatch(set, idx.data(), 64, norm, &x, &y, &a).ok());
  ASSERT_TRUE(FillBatch(set, idx.data(), 64, norm, &x2, &y2, &a).ok());
  EXPECT_TRUE(torch::equal(x, x2));
  a.epoch = 1;
  ASSERT_TRUE(FillBatch(set, idx.data(), 64, norm, &x3, &y3, &a).ok());
  EXPECT_FALSE(torch::equal(x, x3));
  int flipped = 0;
  std::set<std::pair<int, int>> shifts;
  for (int64_t i = 0; i < 64; ++i) {
    const uint8_t* src = set.image(i);
    bool found = false;
    for (int flip = 0; flip < 2 && !found; ++flip) {
      for (int dy = -2; dy <= 2 && !found; ++dy) {
        for (int dx = -2; dx <= 2 && !found; ++dx) {
          bool same = true;
          for (int r = 0; r < 6 && same; ++r) {
            for (int c = 0; c < 5 && same; ++c) {
              const int sr = r + dy, sc = (flip ? 4 - c : c) + dx;
              const float want = (sr >= 0 && sr < 6 && sc >= 0 && sc < 5) ? src[sr * 5 + sc] : 0;
              same = std::abs(x[i][0][r][c].item<float>() - want) < 1e-3f;
            }
          }
          if (same) {
            found = true;
            flipped += flip;
            shifts.insert({dy, dx});
          }
        }
      }
    }
    EXPECT_TRUE(found) << "image " << i << " is no shift or mirror of its source";
    EXPECT_EQ(y[i].item<int64_t>(), set.labels[i]);
  }
  EXPECT_GT(flipped, 16);
  EXPECT_LT(flipped, 48);
  EXPECT_GT(shifts.size(), 12u);  // of the 25
  // Off: the images as they are.
  Augment off;
  ASSERT_TRUE(FillBatch(set, idx.data(), 64, norm, &x2, &y2, &off).ok());
  EXPECT_NEAR(x2[3][0][1][2].item<float>(), set.image(3)[1 * 5 + 2], 1e-3f);
}

TEST(Optimizer, SgdMatchesTorch) {
  OptimizerSpec s;
  s.lr = 0.1;
  s.momentum = 0.9;
  s.weight_decay = 1e-3;
  auto sgd = [](std::vector<torch::Tensor> p, const OptimizerSpec& s) {
    return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::SGD(
        p, torch::optim::SGDOptions(s.lr).momentum(s.momentum).weight_decay(s.weight_decay).nesterov(s.nesterov)));
  };
  for (bool nesterov : {false, true}) {
    s.nesterov = nesterov;
    CompareWithTorch(s, sgd);
    // Where ATen's vectorized loops cover every element (16 floats a turn), the same bits: the
    // one-pass update rounds as ATen's five operations do.
    CompareWithTorch(s, sgd, 4096, /*bitwise=*/true);
  }
}

TEST(Optimizer, AdamMatchesTorch) {
  OptimizerSpec s;
  s.name = "adam";
  s.lr = 0.01;
  s.weight_decay = 1e-2;
  CompareWithTorch(s, [](std::vector<torch::Tensor> p, const OptimizerSpec& s) {
    return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::Adam(
        p, torch::optim::AdamOptions(s.lr).betas({s.beta1, s.beta2}).eps(s.eps).weight_decay(s.weight_decay)));
  });
}

// Trains two steps through the reducer and compares the gradients with plain backward on a
// copy of the model, on `device`; with `channels_last`, the reducer's 4-D parameters are so.
void ExpectReducedGradientsEqualPlainBackward(comm::Communicator* comm, torch::Device device, bool bitwise,
                                              bool channels_last = false) {
  torch::manual_seed(3);
  auto model = *models::MakeModel("cnn", {1, 28, 28, 10});
  auto reference = *models::MakeModel("cnn", {1, 28, 28, 10});
  model->to(device);
  reference->to(device);
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    torch::NoGradGuard g;
    torch::Tensor p = reference->parameters()[i];
    p.copy_(model->parameters()[i]);
    // The same layout on both sides: the same kernels (other kernels round otherwise).
    if (channels_last && p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  // Small buckets: several of them, each reduced as soon as its gradients are in.
  GradientReducer reducer(model->parameters(), comm, 64 << 10, channels_last);
  EXPECT_GT(reducer.bucket_count(), 2u);
  EXPECT_EQ(reducer.flat_grads().device(), device);
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(p.is_contiguous(channels_last && p.dim() == 4 ? torch::MemoryFormat::ChannelsLast
                                                              : torch::MemoryFormat::Contiguous));
    // cuDNN's channels-last kernels need 16-byte aligned weights.
    if (device.is_cuda()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data_ptr()) % 64, 0u);
    }
  }
  torch::Tensor x = torch::randn({8, 1, 28, 28}).to(device);
  torch::Tensor y = torch::randint(0, 10, {8}).to(device);
  for (int step = 0; step < 2; ++step) {  // the second step checks that ZeroGrad re-arms
    reducer.ZeroGrad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    ASSERT_TRUE(reducer.Finish().ok());
  }
  reference->zero_grad();
  torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    const torch::Tensor& got = model->parameters()[i].grad();
    const torch::Tensor& want = reference->parameters()[i].grad();
    EXPECT_TRUE(bitwise ? torch::equal(got, want) : torch::allclose(got, want, 1e-5, 1e-6))
        << "parameter " << i << ": largest difference " << (got - want).abs().max().item<float>() << " of "
        << want.abs().max().item<float>();
  }
  // The parameters now live in the flat buffer.
  EXPECT_EQ(model->parameters()[0].data_ptr<float>() >= reducer.flat_params().data_ptr<float>(), true);
}

TEST(Reducer, FlatGradientsEqualPlainBackward) {
  MemoryStore store;
  auto comm = comm::ConnectGloo(store, {});
  ASSERT_TRUE(comm.ok());
  ExpectReducedGradientsEqualPlainBackward(comm->get(), torch::kCPU, /*bitwise=*/true);
}

// On a GPU, through NCCL: each bucket's sum is queued on the GPU behind its gradients (queued,
// not yet computed, when the hook fires), and the stream waits for the sums. Convolution kernels
// may differ from run to run in the last bits, so this compares with a tolerance.
TEST(Reducer, FlatGradientsEqualPlainBackwardOnTheGpu) {
  if (!torch::cuda::is_available() || !comm::NcclAvailable()) {
    GTEST_SKIP() << "needs a GPU and a trainctl built with CUDA and NCCL";
  }
  // No TF32 (cuDNN's default on Ampere and later, 10 bits of mantissa): the tolerance is for
  // float32's rounding.
  const bool tf32 = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuDNN(false);
  MemoryStore store;
  auto comm = comm::ConnectNccl(store, {});
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  ExpectReducedGradientsEqualPlainBackward(comm->get(), torch::Device(torch::kCUDA, 0), /*bitwise=*/false);
  ExpectReducedGradientsEqualPlainBackward(comm->get(), torch::Device(torch::kCUDA, 0), /*bitwise=*/false,
                                           /*channels_last=*/true);
  at::globalContext().setAllowTF32CuDNN(tf32);
}

// Two ranks (threads), each with its own copy of the model and its own batch: after Finish()
// both hold the same mean of the two plain-backward gradients, laid out in reverse parameter
// order. Over shm the gradients are averaged in shared memory; over Gloo allreduced in buckets.
void ExpectTwoRanksAverage(const std::string& backend) {
  torch::manual_seed(5);
  auto base = *models::MakeModel("cnn", {1, 28, 28, 10});
  std::vector<torch::Tensor> x = {torch::randn({4, 1, 28, 28}), torch::randn({4, 1, 28, 28})};
  std::vector<torch::Tensor> y = {torch::randint(0, 10, {4}), torch::randint(0, 10, {4})};
  auto copy = [&] {
    auto m = *models::MakeModel("cnn", {1, 28, 28, 10});
    torch::NoGradGuard g;
    for (size_t i = 0; i < m->parameters().size(); ++i) m->parameters()[i].copy_(base->parameters()[i]);
    return m;
  };
  std::vector<std::vector<torch::Tensor>> plain(2);
  for (int r = 0; r < 2; ++r) {
    auto m = copy();
    torch::nn::functional::cross_entropy(m->forward(x[r]), y[r]).backward();
    for (auto& p : m->parameters()) plain[r].push_back(p.grad());
  }
  std::vector<torch::Tensor> want_parts;
  for (size_t k = plain[0].size(); k-- > 0;) want_parts.push_back(((plain[0][k] + plain[1][k]) / 2).flatten());
  torch::Tensor want = torch::cat(want_parts);

  MemoryStore store;
  std::vector<std::shared_ptr<models::Classifier>> models = {copy(), copy()};
  std::vector<torch::Tensor> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Result<std::unique_ptr<comm::Communicator>> comm = Unavailable("");
      if (backend == "shm") {
        comm::ShmOptions o;
        o.rank = r;
        o.size = 2;
        comm = comm::ConnectShm(store, o);
      } else {
        comm::GlooOptions o;
        o.rank = r;
        o.size = 2;
        comm = comm::ConnectGloo(store, o);
      }
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      GradientReducer reducer(models[r]->parameters(), comm->get(), 64 << 10);
      EXPECT_GT(reducer.bucket_count(), 2u);
      for (int step = 0; step < 2; ++step) {  // the second step checks the reuse of the buffers
        reducer.ZeroGrad();
        torch::nn::functional::cross_entropy(models[r]->forward(x[r]), y[r]).backward();
        ASSERT_TRUE(reducer.Finish().ok());
      }
      got[r] = reducer.flat_grads().clone();
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(got[0].defined() && got[1].defined());
  EXPECT_TRUE(torch::equal(got[0], got[1]));
  // Over shm every element is (a + b) / 2 in rank order, as computed here; Gloo's ring may
  // add in another order.
  EXPECT_TRUE(backend == "shm" ? torch::equal(got[0], want) : torch::allclose(got[0], want, 1e-5, 1e-6));
}

TEST(Reducer, TwoRanksGetTheMeanOfTheirGradientsThroughSharedMemory) { ExpectTwoRanksAverage("shm"); }
TEST(Reducer, TwoRanksGetTheMeanOfTheirGradientsThroughGloo) { ExpectTwoRanksAverage("gloo"); }

TEST(Data, APreloadedSplitIsTakenFromMemoryOnceAndReadAgainWhenItsFilesChange) {
  testing::Scratch s;
  ASSERT_EQ(::mkdir(s.path("d").c_str(), 0755), 0);
  // Four 2 x 2 images, every pixel `pixel`, labels 0 to 3; the files' times set to `mtime`.
  auto write = [&](char pixel, time_t mtime) {
    const std::string be4 = std::string("\0\0\0\x04", 4), be2 = std::string("\0\0\0\x02", 4);
    s.Write("d/train-images-idx3-ubyte", std::string("\0\0\x08\x03", 4) + be4 + be2 + be2 + std::string(16, pixel));
    s.Write("d/train-labels-idx1-ubyte", std::string("\0\0\x08\x01", 4) + be4 + std::string("\0\1\2\3", 4));
    const timespec times[2] = {{mtime, 0}, {mtime, 0}};
    for (const char* f : {"d/train-images-idx3-ubyte", "d/train-labels-idx1-ubyte"}) {
      ASSERT_EQ(::utimensat(AT_FDCWD, s.path(f).c_str(), times, 0), 0);
    }
  };
  auto first_pixel = [](const Result<data::ImageSet>& set) { return set.ok() ? int{set->pixels.at(0)} : -1; };
  DataSpec spec;
  spec.dataset = "mnist";
  spec.dir = s.path("d");
  write(1, 1000000);
  PreloadSplits(spec, /*test=*/false);
  // Other pixels behind the same size and time: what comes back is the preloaded copy, once, with
  // the normalization the preload computed from it.
  write(2, 1000000);
  Normalizer norm;
  auto preloaded = LoadSplit(spec, true, &norm);
  EXPECT_EQ(first_pixel(preloaded), 1);
  ASSERT_TRUE(preloaded.ok());
  EXPECT_EQ(norm.mean, Normalizer::Compute(*preloaded).mean);
  EXPECT_EQ(norm.std, Normalizer::Compute(*preloaded).std);
  EXPECT_NEAR(norm.mean.at(0), 1 / 255.0, 1e-7);
  auto read = LoadSplit(spec, true, &norm);
  EXPECT_EQ(first_pixel(read), 2);
  EXPECT_NEAR(norm.mean.at(0), 2 / 255.0, 1e-7);
  // A file changed since the preload is read again.
  PreloadSplits(spec, false);
  write(3, 2000000);
  EXPECT_EQ(first_pixel(LoadSplit(spec, true)), 3);
  // So is one replaced by another of the same size and time (as rsync -a or an atomic rename do).
  PreloadSplits(spec, false);
  const std::string images = s.path("d/train-images-idx3-ubyte");
  ASSERT_EQ(::rename(images.c_str(), s.path("d/old").c_str()), 0);
  write(4, 2000000);
  EXPECT_EQ(first_pixel(LoadSplit(spec, true)), 4);
}

TEST(Schedule, WarmupStepAndCosine) {
  OptimizerSpec o;
  o.lr = 0.1;
  ScheduleSpec s;
  s.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 0, 100, 1), 0.01);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 9, 100, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 50, 100, 1), 0.1);
  s.scale_by_world_size = true;
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 50, 100, 4), 0.4);
  s.scale_by_world_size = false;
  s.name = "step";
  s.step_size = 20;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 10 + 39, 100, 1), 0.05);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 10 + 40, 100, 1), 0.025);
  s.name = "cosine";
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 10, 110, 1), 0.1);
  EXPECT_NEAR(LearningRate(o, s, 60, 110, 1), 0.05, 1e-12);
  EXPECT_NEAR(LearningRate(o, s, 110, 110, 1), 0.0, 1e-12);
  // One cycle (OneCycleLR's defaults): from lr/25 up to lr over 30 % of the steps, then down.
  s = ScheduleSpec();
  s.name = "one_cycle";
  s.min_lr = 0.001;
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 0, 100, 1), 0.004);
  EXPECT_NEAR(LearningRate(o, s, 15, 100, 1), 0.052, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 30, 100, 1), 0.1);
  EXPECT_NEAR(LearningRate(o, s, 65, 100, 1), 0.0505, 1e-12);
  EXPECT_NEAR(LearningRate(o, s, 100, 100, 1), 0.001, 1e-12);
  s.warmup_steps = 10;  // the rise's own length
  EXPECT_DOUBLE_EQ(LearningRate(o, s, 10, 100, 1), 0.1);
  EXPECT_GT(LearningRate(o, s, 5, 100, 1), LearningRate(o, s, 4, 100, 1));
}

}  // namespace
}  // namespace trainctl::train
