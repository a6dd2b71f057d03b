// A dataset's splits as the trainer loads them, without LibTorch (train/splits.h).
#include "train/splits.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace trainctl::train {
namespace {

// `bytes` moved to memory that Linux backs with 2 MB pages where it can (transparent huge pages,
// asked for: most kernels give them only on request). A worker server's copies read the kept
// pixels at random; on a VM each 4 KB page's first touch in each copy traps to the hypervisor:
// Fashion-MNIST's 11.5 K pages took 60-76 ms of a copy's first epoch on the 2-core VM, 2 MB pages
// 1-17 ms. The copy is made while the torch plugin loads.
std::vector<uint8_t> OnHugePages(std::vector<uint8_t> bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes.size() < 4 * kHuge) return bytes;
  std::vector<uint8_t> out;
  out.reserve(bytes.size());  // a block this large is mapped for it, not yet touched
  const uintptr_t first = (reinterpret_cast<uintptr_t>(out.data()) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(out.data()) + bytes.size()) & ~(kHuge - 1);
  if (end > first) ::madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);  // a hint: may fail
  out.assign(bytes.begin(), bytes.end());
  return out;
}

data::ImageSet Limit(data::ImageSet set, int64_t limit) {
  if (limit > 0 && limit < set.count) {
    set.count = limit;
    set.pixels.resize(limit * set.image_bytes());
    set.labels.resize(limit);
  }
  return set;
}

// The files a split is read from (none for synthetic data).
std::vector<std::string> SplitFiles(const DataSpec& spec, bool train) {
  if (spec.dataset == "synthetic") return {};
  if (spec.dataset == "cifar10") return data::Cifar10Files(spec.dir, train);
  return data::MnistFiles(spec.dir.empty() ? data::kFashionMnistDir : spec.dir, train);
}

}  // namespace

Result<data::ImageSet> LoadSplitFromFiles(const DataSpec& spec, bool train) {
  int64_t limit = train ? spec.limit : spec.test_limit;
  if (spec.dataset == "imagefolder") {
    data::FolderOptions o;
    o.channels = static_cast<int>(spec.shape[0]);
    o.rows = static_cast<int>(spec.shape[1]);
    o.cols = static_cast<int>(spec.shape[2]);
    o.skip_bad = spec.bad_images != "fail";
    o.limit = limit;
    std::string dir = spec.dir;
    if (spec.test_dir.empty()) {
      o.holdout = spec.holdout;
      o.test = !train;
    } else if (!train) {
      ASSIGN_OR_RETURN(o.classes, data::FolderClasses(spec.dir));  // the labels the model learnt
      dir = spec.test_dir;
    }
    ASSIGN_OR_RETURN(data::Folder folder, data::LoadImageFolder(dir, o));
    if (!folder.skipped.empty()) {
      std::fprintf(stderr, "%s: %zu file(s) skipped, not images that decode (data.bad_images: skip), first: %s\n",
                   dir.c_str(), folder.skipped.size(), folder.skipped[0].c_str());
    }
    return std::move(folder.set);
  }
  if (spec.dataset == "synthetic") {
    int64_t count = train ? spec.samples : std::max<int64_t>(1, spec.samples / 6);
    return Limit(data::Synthetic(count, spec.shape[0], spec.shape[1], spec.shape[2], spec.classes,
                                 train ? 1 : 2),
                 limit);
  }
  const auto files = SplitFiles(spec, train);
  ASSIGN_OR_RETURN(auto set, spec.dataset == "cifar10" ? data::LoadCifar10(files) : data::LoadIdx(files[0], files[1]));
  set.num_classes = 10;
  return Limit(std::move(set), limit);
}

// What a split is: its part of the spec, and its files' identities (device and inode), sizes and
// modification times: a file rewritten or replaced since it was preloaded is read again, a
// replacement also when it keeps the size and time (rsync -a, an atomic rename). Not its content:
// hashing 47 MB at every worker's start would give back most of what the preload saves.
std::string SplitKey(const DataSpec& spec, bool train) {
  std::string key = spec.dataset + '\n' + spec.dir + '\n' + (train ? "train " : "test ") +
                    std::to_string(train ? spec.limit : spec.test_limit);
  if (spec.dataset == "synthetic" || spec.dataset == "imagefolder") {
    key += ' ' + std::to_string(spec.samples) + ' ' + std::to_string(spec.classes);
    for (int64_t d : spec.shape) key += ' ' + std::to_string(d);
  }
  if (spec.dataset == "imagefolder") {
    key += '\n' + spec.test_dir + ' ' + std::to_string(spec.holdout) + ' ' + spec.bad_images;
  }
  for (const auto& path : SplitFiles(spec, train)) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return "";  // nothing to match: the worker reports it
    key += '\n' + path + ' ' + std::to_string(st.st_dev) + ':' + std::to_string(st.st_ino) + ' ' +
           std::to_string(st.st_size) + ' ' + std::to_string(st.st_mtim.tv_sec) + '.' +
           std::to_string(st.st_mtim.tv_nsec);
  }
  return key;
}

std::vector<LoadedSplit> LoadSplitsToKeep(const DataSpec& spec, bool test) {
  std::vector<LoadedSplit> splits;
  for (bool train : {true, false}) {
    if (!train && !test) continue;
    std::string key = SplitKey(spec, train);
    auto set = LoadSplitFromFiles(spec, train);
    if (key.empty() || !set.ok()) continue;
    set->pixels = OnHugePages(std::move(set->pixels));
    Normalizer norm = train ? Normalizer::Compute(*set) : Normalizer{};
    splits.push_back({std::move(key), train, std::move(*set), std::move(norm)});
  }
  return splits;
}

Normalizer Normalizer::Compute(const data::ImageSet& set) {
  // Pixels are bytes: count each value (exact), and take the sums from the 256 counts. Summing
  // 47 M doubles one after the other (Fashion-MNIST's training set) was a chain of dependent adds,
  // 0.12 s of every worker's start.
  Normalizer n;
  const int64_t plane = int64_t{set.rows} * set.cols;
  for (int c = 0; c < set.channels; ++c) {
    // Four tables, so that a run of equal pixels (a black background) is not one chain of
    // increments of the same counter through memory.
    uint64_t counts[4][256] = {};
    for (int64_t i = 0; i < set.count; ++i) {
      const uint8_t* p = set.image(i) + c * plane;
      int64_t k = 0;
      for (; k + 4 <= plane; k += 4) {
        ++counts[0][p[k]];
        ++counts[1][p[k + 1]];
        ++counts[2][p[k + 2]];
        ++counts[3][p[k + 3]];
      }
      for (; k < plane; ++k) ++counts[0][p[k]];
    }
    uint64_t sum = 0, sq = 0;  // of the byte values: below 2^64 for any set that fits in memory
    for (uint64_t v = 0; v < 256; ++v) {
      const uint64_t n_v = counts[0][v] + counts[1][v] + counts[2][v] + counts[3][v];
      sum += n_v * v;
      sq += n_v * v * v;
    }
    double count = std::max<double>(1, double(set.count) * plane);
    double mean = double(sum) / 255.0 / count;
    double var = std::max(0.0, double(sq) / (255.0 * 255.0) / count - mean * mean);
    n.mean.push_back(static_cast<float>(mean));
    n.std.push_back(static_cast<float>(std::max(1e-3, std::sqrt(var))));
  }
  return n;
}

}  // namespace trainctl::train
