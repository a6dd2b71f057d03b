// A dataset's splits as the trainer loads them (what a DataSpec names, cut to its limits) and
// their normalization, without LibTorch: a worker server loads them in the CLI's code while the
// torch plugin loads (cli/torch_verbs.cc), the trainer through train/torch_data.h.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "data/dataset.h"
#include "jobspec/job_spec.h"

namespace trainctl::train {

// Per-channel mean and standard deviation of pixel values in [0, 1]; images are fed to the model
// as (pixel / 255 - mean) / std.
struct Normalizer {
  std::vector<float> mean, std;
  static Normalizer Compute(const data::ImageSet& set);
};

// The training or test split that `spec` names, read from its files, cut to spec.limit /
// spec.test_limit.
Result<data::ImageSet> LoadSplitFromFiles(const DataSpec& spec, bool train);

// What a split is: its part of the spec and its files' identities; "" where a file is missing.
std::string SplitKey(const DataSpec& spec, bool train);

// A split loaded to be kept in a process for its copies (train/torch_data.h, PreloadSplits).
struct LoadedSplit {
  std::string key;  // SplitKey's
  bool train = true;
  data::ImageSet set;
  Normalizer norm;  // a training split's; empty for a test split
};
// The splits a worker will load (the test split too if `test`), with the training split's
// normalization; a split that cannot be loaded is left out, for the worker to report.
std::vector<LoadedSplit> LoadSplitsToKeep(const DataSpec& spec, bool test);

}  // namespace trainctl::train
