// A dataset's splits as the trainer loads them, without LibTorch (train/splits.h).
#include "train/splits.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/cpus.h"
#include "data/image_stream.h"

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

// An image folder split's view: the spec's shape (the first training picture's when it has
// none: a spec that trainctl run did not resolve, as in a cluster's pod); random resized crops for
// training when asked.
data::ViewOptions FolderView(const DataSpec& spec, bool train) {
  data::ViewOptions v;
  std::vector<int64_t> shape = spec.shape;
  if (shape.size() != 3) {
    auto first = data::FolderShape(spec.dir);
    shape = first.ok() ? *first : std::vector<int64_t>{3, 32, 32};  // the listing's error comes next
  }
  v.channels = static_cast<int>(shape[0]);
  v.rows = static_cast<int>(shape[1]);
  v.cols = static_cast<int>(shape[2]);
  v.crop_pct = spec.crop_pct > 0 ? spec.crop_pct : spec.random_resized_crop ? 0.875 : 1.0;
  v.random_resized_crop = train && spec.random_resized_crop;
  v.scale_min = spec.scale[0];
  v.scale_max = spec.scale[1];
  v.ratio_min = spec.ratio[0];
  v.ratio_max = spec.ratio[1];
  return v;
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
    o.view = FolderView(spec, train);
    o.skip_bad = spec.bad_images != "fail";
    o.leave_out_bad = !train;  // a test picture that does not decode counts nowhere, not as another
    o.limit = limit;
    o.threads = spec.threads > 0 ? spec.threads : UsableCpus();
    o.cache_dir = data::DefaultListCacheDir();
    std::string dir = spec.dir;
    if (spec.test_dir.empty()) {
      o.holdout = spec.holdout;
      o.test = !train;
    } else if (!train) {
      ASSIGN_OR_RETURN(o.classes, data::FolderClasses(spec.dir));  // the labels the model learnt
      dir = spec.test_dir;
    }
    // Streamed when asked, or when the decoded pictures would take more than a quarter of this
    // machine's memory (or the training crops are drawn anew each epoch).
    std::string why;
    if (spec.load == "stream" || spec.random_resized_crop) {
      o.stream = true;
      why = spec.load == "stream" ? "load: stream" : "a new random resized crop of each picture every epoch";
    } else if (spec.load == "auto") {
      o.stream = true;  // listed first: the count decides
    }
    ASSIGN_OR_RETURN(data::Folder folder, data::LoadImageFolder(dir, o));
    const int64_t decoded = folder.set.count * folder.set.image_bytes();
    const int64_t budget = UsableMemoryBytes() / 4;
    if (spec.load == "auto" && !spec.random_resized_crop) {
      if (decoded <= budget) {
        o.stream = false;
        folder.set = {};
        ASSIGN_OR_RETURN(folder, data::LoadImageFolder(dir, o));
        why = "load: auto; its pictures decoded take " + std::to_string(decoded >> 20) +
              " MiB, within a quarter of "
              "this machine's memory";
      } else {
        why = "load: auto; its pictures decoded would take " + std::to_string(decoded >> 20) +
              " MiB, more than a "
              "quarter of this machine's memory (" +
              std::to_string(budget >> 20) + " MiB)";
      }
    }
    if (why.empty()) why = "load: memory";
    const auto& l = folder.listing;
    char listed[96];
    if (l.from_cache) {
      std::snprintf(listed, sizeof listed, "its file list from the cache in %.2f s", l.seconds);
    } else {
      std::snprintf(listed, sizeof listed, "%d class folder(s) listed in %.2f s", l.listed, l.seconds);
    }
    folder.set.origin = dir + ": " + std::to_string(folder.set.count) + (train ? " training" : " test") +
                        " images in " + std::to_string(folder.classes.size()) + " classes (" + listed +
                        (l.cache_refused.empty() ? "" : "; the list cache not used: " + l.cache_refused) + "); " +
                        (folder.set.stream ? "streamed, each batch decoded as it is used (" + why + ")"
                                           : "decoded into memory (" + why + ")");
    folder.set.skipped = std::move(folder.skipped);  // the trainer names them, once
    return std::move(folder.set);
  }
  if (spec.dataset == "synthetic") {
    int64_t count = train ? spec.samples : std::max<int64_t>(1, spec.samples / 6);
    return Limit(data::Synthetic(count, spec.shape[0], spec.shape[1], spec.shape[2], spec.classes, train ? 1 : 2),
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
    key += '\n' + spec.test_dir + ' ' + std::to_string(spec.holdout) + ' ' + spec.bad_images + ' ' + spec.load + ' ' +
           std::to_string(spec.crop_pct) + ' ' + std::to_string(spec.random_resized_crop);
    for (double v : {spec.scale[0], spec.scale[1], spec.ratio[0], spec.ratio[1]}) key += ' ' + std::to_string(v);
  }
  for (const auto& path : SplitFiles(spec, train)) {
    struct stat st {};
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

namespace {

// A streamed set's statistics from at most 1024 of its pictures, spread over it (a deterministic
// sample), decoded by its threads, which are ended after: a worker server computes it before it
// forks.
data::ImageSet StreamSample(const data::ImageSet& set) {
  data::ImageSet sample;
  sample.channels = set.channels;
  sample.rows = set.rows;
  sample.cols = set.cols;
  const int64_t n = std::min<int64_t>(1024, set.count);
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[i] = i * set.count / n;
  sample.pixels.resize(static_cast<size_t>(n * set.image_bytes()));
  sample.labels.resize(static_cast<size_t>(n));
  if (set.stream->Get(indices.data(), n, 0, sample.pixels.data(), sample.labels.data()).ok()) sample.count = n;
  set.stream->Stop();
  return sample;
}

}  // namespace

Normalizer Normalizer::Compute(const data::ImageSet& streamed_or_not) {
  const data::ImageSet sample = streamed_or_not.stream ? StreamSample(streamed_or_not) : data::ImageSet{};
  const data::ImageSet& set = streamed_or_not.stream ? sample : streamed_or_not;
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
