#include "data/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "common/fs.h"

namespace trainctl::data {
namespace {

// Largest file we accept: the real datasets are far below it; a bigger one is corrupt or wrong.
constexpr int64_t kMaxBytes = int64_t{4} << 30;

// Reads a whole file, inflating it if it is gzip; plain files pass through unchanged (zlib
// detects the format from the content).
Result<std::string> ReadMaybeGzip(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot open dataset file " + path, errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  gzFile f = ::gzopen(path.c_str(), "rb");
  if (!f) return ErrnoStatus("cannot open dataset file " + path, errno ? errno : ENOMEM);
  ::gzbuffer(f, 1 << 20);
  std::string out;
  char buf[1 << 16];
  while (true) {
    int n = ::gzread(f, buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      std::string msg = ::gzerror(f, &code);
      ::gzclose(f);
      return InvalidArgument(path + ": corrupt gzip data (" + msg + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(out.size()) > kMaxBytes) {
      ::gzclose(f);
      return InvalidArgument(path + ": larger than 4 GiB uncompressed; not a dataset file trainctl reads");
    }
  }
  int rc = ::gzclose(f);
  if (rc == Z_BUF_ERROR) return InvalidArgument(path + ": truncated gzip data (the file ends early)");
  if (rc != Z_OK) return InvalidArgument(path + ": corrupt gzip data");
  return out;
}

uint32_t BigEndian32(const std::string& s, size_t at) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[at + i])); };
  return b(0) << 24 | b(1) << 16 | b(2) << 8 | b(3);
}

// Checks an idx header: magic 0x0000 08 <dims>, then the sizes; returns them.
Result<std::vector<uint32_t>> IdxHeader(const std::string& data, const std::string& path, int dims,
                                        const char* what) {
  size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (data.size() < header) {
    return InvalidArgument(path + ": truncated: " + std::to_string(data.size()) +
                           " bytes, shorter than an idx header");
  }
  uint32_t magic = BigEndian32(data, 0);
  uint32_t want = 0x00000800u | static_cast<uint32_t>(dims);
  if (magic != want) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "not an idx%d %s file (magic 0x%08x, expected 0x%08x)", dims,
                  what, magic, want);
    return InvalidArgument(path + ": " + buf);
  }
  std::vector<uint32_t> sizes;
  uint64_t payload = 1;
  for (int d = 0; d < dims; ++d) {
    sizes.push_back(BigEndian32(data, 4 + 4 * static_cast<size_t>(d)));
    payload *= sizes.back();
    if (payload > static_cast<uint64_t>(kMaxBytes)) return InvalidArgument(path + ": sizes in the header are too large");
  }
  if (data.size() != header + payload) {
    return InvalidArgument(path + ": " + (data.size() < header + payload ? "truncated" : "trailing data") +
                           ": the header promises " + std::to_string(header + payload) +
                           " bytes, the file has " + std::to_string(data.size()));
  }
  return sizes;
}

Status CheckLabels(const ImageSet& set, const std::string& path, int max_classes) {
  for (int64_t i = 0; i < set.count; ++i) {
    if (set.labels[i] >= max_classes) {
      return InvalidArgument(path + ": label " + std::to_string(set.labels[i]) + " of item " +
                             std::to_string(i) + " is out of range (expected 0 to " +
                             std::to_string(max_classes - 1) + ")");
    }
  }
  return Status::Ok();
}

int NumClasses(const std::vector<uint8_t>& labels) {
  int top = -1;
  for (uint8_t l : labels) top = std::max<int>(top, l);
  return top + 1;
}

}  // namespace

Result<ImageSet> LoadIdxImages(const std::string& images_path) {
  ASSIGN_OR_RETURN(std::string images, ReadMaybeGzip(images_path));
  ASSIGN_OR_RETURN(auto image_dims, IdxHeader(images, images_path, 3, "image"));
  ImageSet set;
  set.count = image_dims[0];
  set.channels = 1;
  set.rows = static_cast<int>(image_dims[1]);
  set.cols = static_cast<int>(image_dims[2]);
  set.pixels.assign(images.begin() + 16, images.end());
  set.labels.assign(set.count, 0);
  return set;
}

Result<ImageSet> LoadIdx(const std::string& images_path, const std::string& labels_path) {
  ASSIGN_OR_RETURN(ImageSet set, LoadIdxImages(images_path));
  ASSIGN_OR_RETURN(std::string labels, ReadMaybeGzip(labels_path));
  ASSIGN_OR_RETURN(auto label_dims, IdxHeader(labels, labels_path, 1, "label"));
  if (set.count != static_cast<int64_t>(label_dims[0])) {
    return InvalidArgument(images_path + " has " + std::to_string(set.count) + " images but " +
                           labels_path + " has " + std::to_string(label_dims[0]) + " labels");
  }
  set.labels.assign(labels.begin() + 8, labels.end());
  RETURN_IF_ERROR(CheckLabels(set, labels_path, 256));
  set.num_classes = NumClasses(set.labels);
  return set;
}

Result<ImageSet> LoadMnistDir(const std::string& dir, bool train) {
  std::string prefix = dir + "/" + (train ? "train" : "t10k");
  auto pick = [](const std::string& base) { return Exists(base) ? base : base + ".gz"; };
  return LoadIdx(pick(prefix + "-images-idx3-ubyte"), pick(prefix + "-labels-idx1-ubyte"));
}

Status CheckDataDir(const std::string& dataset, const std::string& dir) {
  std::vector<std::string> files;
  if (dataset == "cifar10") {
    for (int i = 1; i <= 5; ++i) files.push_back("data_batch_" + std::to_string(i) + ".bin");
    files.push_back("test_batch.bin");
  } else if (dataset == "mnist" || dataset == "fashion-mnist") {
    files = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte"};
  }
  for (const auto& f : files) {
    std::string path = dir + "/" + f;
    bool gz_ok = dataset != "cifar10" && Exists(path + ".gz");
    if (!Exists(path) && !gz_ok) {
      return NotFound(path + (dataset == "cifar10" ? "" : "[.gz]") + ": no such file; expected the " +
                      dataset + " files in " + dir +
                      (dataset == "fashion-mnist" && dir == kFashionMnistDir
                           ? " (apt-get install dataset-fashion-mnist)" : ""));
    }
  }
  return Status::Ok();
}

Result<ImageSet> LoadCifar10(const std::vector<std::string>& batch_paths) {
  constexpr int64_t kPixels = 3 * 32 * 32, kRecord = 1 + kPixels;
  if (batch_paths.empty()) return InvalidArgument("no CIFAR-10 batch files given");
  ImageSet set;
  set.channels = 3;
  set.rows = set.cols = 32;
  for (const auto& path : batch_paths) {
    ASSIGN_OR_RETURN(std::string data, ReadMaybeGzip(path));
    if (data.empty() || data.size() % kRecord != 0) {
      return InvalidArgument(path + ": " + std::to_string(data.size()) +
                             " bytes is not a whole number of CIFAR-10 records (3073 bytes each: "
                             "a label byte and 3x32x32 pixels); truncated or not CIFAR-10 binary");
    }
    int64_t n = static_cast<int64_t>(data.size()) / kRecord;
    for (int64_t i = 0; i < n; ++i) {
      uint8_t label = static_cast<uint8_t>(data[i * kRecord]);
      if (label > 9) {
        return InvalidArgument(path + ": record " + std::to_string(i) + " has label " +
                               std::to_string(label) + " (expected 0 to 9)");
      }
      set.labels.push_back(label);
      set.pixels.insert(set.pixels.end(), data.begin() + i * kRecord + 1, data.begin() + (i + 1) * kRecord);
    }
    set.count += n;
  }
  set.num_classes = 10;
  return set;
}

ImageSet Synthetic(int64_t count, int channels, int rows, int cols, int num_classes, uint64_t seed) {
  ImageSet set;
  set.count = count;
  set.channels = channels;
  set.rows = rows;
  set.cols = cols;
  set.num_classes = num_classes;
  std::mt19937_64 rng(seed);
  set.pixels.resize(static_cast<size_t>(count * set.image_bytes()));
  for (auto& p : set.pixels) p = static_cast<uint8_t>(rng());
  set.labels.resize(static_cast<size_t>(count));
  for (auto& l : set.labels) l = static_cast<uint8_t>(rng() % static_cast<uint64_t>(num_classes));
  return set;
}

const std::vector<std::string>& FashionMnistClasses() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

}  // namespace trainctl::data
