#include "data/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/fs.h"

namespace trainctl::data {
namespace {

// Largest file we accept: the real datasets are far below it; a bigger one is corrupt or wrong.
constexpr int64_t kMaxBytes = int64_t{4} << 30;

// The size a file holds, as far as a cheap look tells: a gzip stream's trailer gives its
// uncompressed size modulo 2^32 (a hint only: a file of several streams, or a lying trailer, is
// read to its end all the same, and a hint beyond what deflate can expand to is cut).
size_t SizeHint(const std::string& path, int64_t file_size) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return 0;
  unsigned char magic[2] = {0, 0}, trailer[4] = {0, 0, 0, 0};
  size_t hint = static_cast<size_t>(file_size);
  if (std::fread(magic, 1, 2, f) == 2 && magic[0] == 0x1f && magic[1] == 0x8b && file_size >= 18 &&
      std::fseek(f, -4, SEEK_END) == 0 && std::fread(trailer, 1, 4, f) == 4) {
    hint = uint32_t{trailer[0]} | uint32_t{trailer[1]} << 8 | uint32_t{trailer[2]} << 16 | uint32_t{trailer[3]} << 24;
  }
  std::fclose(f);
  // Deflate expands at most about 1032:1: a trailer promising more is not believed.
  return std::min<size_t>({hint, static_cast<size_t>(file_size) * 1040 + 64, static_cast<size_t>(kMaxBytes) + 1});
}

// Reads a whole file into `out`, inflating it if it is gzip; plain files pass through unchanged
// (zlib detects the format from the content). Inflates straight into `out`, sized from the
// gzip trailer: growing a buffer 64 KB at a time and copying the images out of it cost a worker
// three copies of Fashion-MNIST's 47 MB and their page faults at every start.
Status ReadMaybeGzip(const std::string& path, std::vector<uint8_t>* out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot open dataset file " + path, errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  const size_t hint = SizeHint(path, st.st_size);
  gzFile f = ::gzopen(path.c_str(), "rb");
  if (!f) return ErrnoStatus("cannot open dataset file " + path, errno ? errno : ENOMEM);
  ::gzbuffer(f, 1 << 20);
  out->resize(std::max<size_t>(hint + 1, 1 << 16));  // one more: EOF is seen without growing
  size_t size = 0;
  // An idx file says how large it is in its first bytes: checked before the rest is inflated. A
  // gzip stream holds at most 1032 bytes per compressed byte (deflate's limit), so a header that
  // declares more than its file can hold is refused at once, and nothing past it is read.
  size_t declared = 0;
  {
    const int n = ::gzread(f, out->data(), 16);
    if (n > 0) size = static_cast<size_t>(n);
    if (size >= 8 && (*out)[0] == 0 && (*out)[1] == 0 && (*out)[2] == 0x08 && (*out)[3] >= 1 && (*out)[3] <= 3 &&
        size >= 4 + 4 * static_cast<size_t>((*out)[3])) {
      const int dims = (*out)[3];
      uint64_t bytes = 1;
      for (int d = 0; d < dims && bytes <= static_cast<uint64_t>(kMaxBytes); ++d) {
        const size_t at = 4 + 4 * static_cast<size_t>(d);
        bytes *= uint64_t{(*out)[at]} << 24 | uint64_t{(*out)[at + 1]} << 16 | uint64_t{(*out)[at + 2]} << 8 |
                 (*out)[at + 3];
      }
      bytes += 4 + 4 * static_cast<uint64_t>(dims);
      const bool gz = ::gzdirect(f) == 0;
      if (gz && bytes > static_cast<uint64_t>(st.st_size) * 1032 + (1 << 20)) {
        ::gzclose(f);
        return InvalidArgument(path + ": its header declares " + std::to_string(bytes) + " bytes, more than " +
                               std::to_string(st.st_size) + " compressed bytes can hold");
      }
      if (bytes <= static_cast<uint64_t>(kMaxBytes)) {
        declared = static_cast<size_t>(bytes);
        out->resize(declared + 1);
      }
    }
  }
  while (true) {
    if (size == out->size()) out->resize(out->size() + out->size() / 2);
    const unsigned want = static_cast<unsigned>(std::min<size_t>(out->size() - size, 1u << 30));
    int n = ::gzread(f, out->data() + size, want);
    if (n < 0) {
      int code = 0;
      std::string msg = ::gzerror(f, &code);
      ::gzclose(f);
      return InvalidArgument(path + ": corrupt gzip data (" + msg + ")");
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
    if (declared > 0 && size > declared) break;  // longer than it says: IdxHeader names it
    if (static_cast<int64_t>(size) > kMaxBytes) {
      ::gzclose(f);
      return InvalidArgument(path + ": larger than 4 GiB uncompressed; not a dataset file trainctl reads");
    }
  }
  out->resize(size);
  int rc = ::gzclose(f);
  if (rc == Z_BUF_ERROR) return InvalidArgument(path + ": truncated gzip data (the file ends early)");
  if (rc != Z_OK) return InvalidArgument(path + ": corrupt gzip data");
  return Status::Ok();
}

uint32_t BigEndian32(const std::vector<uint8_t>& s, size_t at) {
  return uint32_t{s[at]} << 24 | uint32_t{s[at + 1]} << 16 | uint32_t{s[at + 2]} << 8 | s[at + 3];
}

// Checks an idx header: magic 0x0000 08 <dims>, then the sizes; returns them.
Result<std::vector<uint32_t>> IdxHeader(const std::vector<uint8_t>& data, const std::string& path, int dims,
                                        const char* what) {
  size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (data.size() < header) {
    return InvalidArgument(path + ": truncated: " + std::to_string(data.size()) + " bytes, shorter than an idx header");
  }
  uint32_t magic = BigEndian32(data, 0);
  uint32_t want = 0x00000800u | static_cast<uint32_t>(dims);
  if (magic != want) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "not an idx%d %s file (magic 0x%08x, expected 0x%08x)", dims, what, magic, want);
    return InvalidArgument(path + ": " + buf);
  }
  std::vector<uint32_t> sizes;
  uint64_t payload = 1;
  for (int d = 0; d < dims; ++d) {
    sizes.push_back(BigEndian32(data, 4 + 4 * static_cast<size_t>(d)));
    // A size of 0 would let any count through the checks below (and the labels be sized from it).
    if (sizes.back() == 0) {
      return InvalidArgument(path + ": the header gives dimension " + std::to_string(d + 1) + " of " +
                             std::to_string(dims) + " a size of 0");
    }
    payload *= sizes.back();
    if (payload > static_cast<uint64_t>(kMaxBytes))
      return InvalidArgument(path + ": sizes in the header are too large");
  }
  if (data.size() != header + payload) {
    return InvalidArgument(path + ": " + (data.size() < header + payload ? "truncated" : "trailing data") +
                           ": the header promises " + std::to_string(header + payload) + " bytes, the file has " +
                           std::to_string(data.size()));
  }
  return sizes;
}

Status CheckLabels(const ImageSet& set, const std::string& path, int max_classes) {
  for (int64_t i = 0; i < set.count; ++i) {
    if (set.labels[i] >= max_classes) {
      return InvalidArgument(path + ": label " + std::to_string(set.labels[i]) + " of item " + std::to_string(i) +
                             " is out of range (expected 0 to " + std::to_string(max_classes - 1) + ")");
    }
  }
  return Status::Ok();
}

int NumClasses(const std::vector<uint16_t>& labels) {
  int top = -1;
  for (uint16_t l : labels) top = std::max<int>(top, l);
  return top + 1;
}

}  // namespace

Result<ImageSet> LoadIdxImages(const std::string& images_path) {
  ImageSet set;
  RETURN_IF_ERROR(ReadMaybeGzip(images_path, &set.pixels));
  ASSIGN_OR_RETURN(auto image_dims, IdxHeader(set.pixels, images_path, 3, "image"));
  set.count = image_dims[0];
  set.channels = 1;
  set.rows = static_cast<int>(image_dims[1]);
  set.cols = static_cast<int>(image_dims[2]);
  set.pixels.erase(set.pixels.begin(), set.pixels.begin() + 16);  // the header, in place
  set.labels.assign(set.count, 0);
  return set;
}

Result<ImageSet> LoadIdx(const std::string& images_path, const std::string& labels_path) {
  ASSIGN_OR_RETURN(ImageSet set, LoadIdxImages(images_path));
  std::vector<uint8_t> labels;
  RETURN_IF_ERROR(ReadMaybeGzip(labels_path, &labels));
  ASSIGN_OR_RETURN(auto label_dims, IdxHeader(labels, labels_path, 1, "label"));
  if (set.count != static_cast<int64_t>(label_dims[0])) {
    return InvalidArgument(images_path + " has " + std::to_string(set.count) + " images but " + labels_path + " has " +
                           std::to_string(label_dims[0]) + " labels");
  }
  set.labels.assign(labels.begin() + 8, labels.end());
  RETURN_IF_ERROR(CheckLabels(set, labels_path, 256));
  set.num_classes = NumClasses(set.labels);
  return set;
}

std::vector<std::string> MnistFiles(const std::string& dir, bool train) {
  std::string prefix = dir + "/" + (train ? "train" : "t10k");
  auto pick = [](const std::string& base) { return Exists(base) ? base : base + ".gz"; };
  return {pick(prefix + "-images-idx3-ubyte"), pick(prefix + "-labels-idx1-ubyte")};
}

Result<ImageSet> LoadMnistDir(const std::string& dir, bool train) {
  const auto files = MnistFiles(dir, train);
  return LoadIdx(files[0], files[1]);
}

std::vector<std::string> Cifar10Files(const std::string& dir, bool train) {
  if (!train) return {dir + "/test_batch.bin"};
  std::vector<std::string> files;
  for (int i = 1; i <= 5; ++i) files.push_back(dir + "/data_batch_" + std::to_string(i) + ".bin");
  return files;
}

Status CheckDataDir(const std::string& dataset, const std::string& dir) {
  if (dataset == "imagefolder") return FolderClasses(dir).status();
  std::vector<std::string> paths;
  if (dataset == "cifar10") {
    paths = Cifar10Files(dir, true);
    paths.push_back(Cifar10Files(dir, false)[0]);
  } else if (dataset == "mnist" || dataset == "fashion-mnist") {
    for (const char* f :
         {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
      paths.push_back(dir + "/" + f);
    }
  }
  for (const auto& path : paths) {
    bool gz_ok = dataset != "cifar10" && Exists(path + ".gz");
    if (!Exists(path) && !gz_ok) {
      return NotFound(
          path + (dataset == "cifar10" ? "" : "[.gz]") + ": no such file; expected the " + dataset + " files in " +
          dir +
          (dataset == "fashion-mnist" && dir == kFashionMnistDir ? " (apt-get install dataset-fashion-mnist)" : ""));
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
    std::vector<uint8_t> data;
    RETURN_IF_ERROR(ReadMaybeGzip(path, &data));
    if (data.empty() || data.size() % kRecord != 0) {
      return InvalidArgument(path + ": " + std::to_string(data.size()) +
                             " bytes is not a whole number of CIFAR-10 records (3073 bytes each: "
                             "a label byte and 3x32x32 pixels); truncated or not CIFAR-10 binary");
    }
    int64_t n = static_cast<int64_t>(data.size()) / kRecord;
    for (int64_t i = 0; i < n; ++i) {
      uint8_t label = data[i * kRecord];
      if (label > 9) {
        return InvalidArgument(path + ": record " + std::to_string(i) + " has label " + std::to_string(label) +
                               " (expected 0 to 9)");
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
  for (auto& l : set.labels) l = static_cast<uint16_t>(rng() % static_cast<uint64_t>(num_classes));
  return set;
}

const std::vector<std::string>& FashionMnistClasses() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

}  // namespace trainctl::data
