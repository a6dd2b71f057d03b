// The trainer's view of the datasets: loading what a DataSpec names, per-channel normalization,
// batches as tensors, class names, and the model state <-> checkpoint blobs conversion.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/status.h"
#include "data/dataset.h"
#include "jobspec/job_spec.h"
#include "train/splits.h"

namespace trainctl::train {

// Loads the training or test split that `spec` names, cut to spec.limit / spec.test_limit, and
// with `norm`, its normalization. A split preloaded in this process (below) is taken from there,
// once, if its files are unchanged.
Result<data::ImageSet> LoadSplit(const DataSpec& spec, bool train, Normalizer* norm = nullptr);
// Loads the splits a worker will load (the test split too if `test`) and the training split's
// normalization, to keep in this process: a worker server does, before it makes its copies
// (agent/worker_forks.h), so that each copy finds the decoded images in its memory, shared with
// the server's, instead of reading and inflating the files again and reading all their pixels
// for the normalization (75 ms of a copy's start on Fashion-MNIST). A split that cannot be
// loaded is left for the worker to report. Returns the preloaded training split, or null.
const data::ImageSet* PreloadSplits(const DataSpec& spec, bool test);
// The same with splits loaded already (LoadSplitsToKeep, train/splits.h): a worker server's
// first thread loads them while the plugin with LibTorch is being loaded.
const data::ImageSet* KeepSplits(std::vector<LoadedSplit> loaded);

// Class names for a dataset ("T-shirt/top", ...; "class 7" when it has none); `own`, an image
// folder's, when it names every class.
std::vector<std::string> ClassNames(const std::string& dataset, int classes, const std::vector<std::string>& own = {});

// Training-time augmentation (trainer.data.augment), as torchvision's RandomCrop(size,
// padding=crop_padding) then RandomHorizontalFlip(): each image shifted by up to crop_padding
// pixels each way (what comes in from outside is black, pixel 0, as torchvision pads) and mirrored
// with probability 1/2. Drawn from a hash of (seed, epoch, the image's index), not a generator's
// state: a resumed run, or another world size, augments each image of an epoch as the
// uninterrupted run did.
struct Augment {
  int crop_padding = 0;
  bool flip = false;
  uint64_t seed = 0;
  int64_t epoch = 0;
  bool on() const { return crop_padding > 0 || flip; }
};

// For a batch the next step will gather: asks the CPU to bring images `indices[0..n)` toward its
// caches, without waiting for them; for a streamed set, has its threads decode them (`epoch`:
// the batch's, for the views' draws).
void PrefetchImages(const data::ImageSet& set, const int64_t* indices, int64_t n, int64_t epoch = 0);

// Gathers images `indices[0..n)` into x (n x C x H x W float, normalized; or, when x is a uint8
// tensor already, the bytes as they are, for normalization where the step runs) and y (n, int64),
// augmented when `augment` says so: the only per-step copy of the data. A streamed set's images
// are decoded here (or were, by a PrefetchImages of the same batch); its errors (a file that does
// not decode, with data.bad_images: fail) are returned.
Status FillBatch(const data::ImageSet& set, const int64_t* indices, int64_t n, const Normalizer& norm, torch::Tensor* x,
                 torch::Tensor* y, const Augment* augment = nullptr);

// Tensors <-> safetensors blobs (CPU, contiguous copies).
checkpoint::Blob ToBlob(const std::string& name, const torch::Tensor& t);
// Copies a blob into `dst`, checking dtype and shape; the error names the tensor.
Status CopyBlob(const checkpoint::Blob& blob, torch::Tensor dst);

}  // namespace trainctl::train

namespace trainctl::train {

// A module's parameters and buffers as blobs named as in PyTorch ("conv1.weight",
// "layer1.0.bn1.running_mean"), appended to `out`.
void AddModuleState(torch::nn::Module& module, std::vector<checkpoint::Blob>* out);
// Copies every parameter and buffer of `module` from `ckpt`; the error names what is missing or
// does not fit.
Status LoadModuleState(torch::nn::Module& module, const checkpoint::Checkpoint& ckpt);

}  // namespace trainctl::train
