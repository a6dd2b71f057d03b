// Image classification datasets held once per process as raw bytes (N x C x H x W uint8, and one
// uint8 label per image): Fashion-MNIST/MNIST idx files (gzipped or raw), CIFAR-10 binary
// batches, and synthetic data of any shape. No torch here: the trainer wraps these bytes.
//
// Every loader validates what it reads; a missing, truncated or corrupt file gives an error that
// names the file and what is wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/file_list.h"
#include "data/image_view.h"

namespace trainctl::data {

class ImageStream;

struct ImageSet {
  int64_t count = 0;
  int channels = 1, rows = 0, cols = 0;
  int num_classes = 0;                   // 1 + the largest label
  std::vector<uint8_t> pixels;           // count * channels * rows * cols, image-major, then C, H, W
  std::vector<uint16_t> labels;          // count
  std::vector<std::string> class_names;  // an image folder's, index = label; else empty
  // A streamed image folder (data/image_stream.h): no pixels here; each batch's images are read
  // and decoded when it is asked for (train/torch_data.h's FillBatch).
  std::shared_ptr<ImageStream> stream;
  std::string origin;                // an image folder's: where it came from and how it is read, for the log
  std::vector<std::string> skipped;  // an image folder decoded into memory: the files that did not decode, and why

  int64_t image_bytes() const { return int64_t{channels} * rows * cols; }
  const uint8_t* image(int64_t i) const { return pixels.data() + i * image_bytes(); }
};

// Reads an idx3 image file alone (labels all 0).
Result<ImageSet> LoadIdxImages(const std::string& images_path);
// Reads one image file: PNG (8-bit grey, grey+alpha, RGB, RGBA or palette; alpha dropped), or
// binary or plain PGM/PPM (P5, P2, P6, P3, maxval up to 255). One image, label 0, 1 or 3
// channels. Errors name the file and what is wrong with it; nothing is trusted.
Result<ImageSet> ReadImageFile(const std::string& path);
// The same from the file's bytes; `path` names it in errors.
Result<ImageSet> DecodeImage(const std::string& bytes, const std::string& path);
// Reads an idx3 image file and its idx1 label file (gzip detected by content, not by name).
Result<ImageSet> LoadIdx(const std::string& images_path, const std::string& labels_path);
// The standard Fashion-MNIST/MNIST file names in `dir`: train-images-idx3-ubyte[.gz] and
// train-labels-idx1-ubyte[.gz], or t10k-* for the test split.
Result<ImageSet> LoadMnistDir(const std::string& dir, bool train);
// The two files LoadMnistDir reads: images, labels (each uncompressed where both are there).
std::vector<std::string> MnistFiles(const std::string& dir, bool train);
// CIFAR-10 binary batches: records of 1 label byte + 3072 pixel bytes (3 x 32 x 32).
Result<ImageSet> LoadCifar10(const std::vector<std::string>& batch_paths);
// The batch files of CIFAR-10's training split in `dir` (data_batch_1..5.bin), or of its test
// split (test_batch.bin).
std::vector<std::string> Cifar10Files(const std::string& dir, bool train);
// Random pixels and labels, reproducible from `seed`.
ImageSet Synthetic(int64_t count, int channels, int rows, int cols, int num_classes, uint64_t seed);

// torchvision's ImageFolder: a folder per class in `dir` (the classes in name order), each holding
// PNG, JPEG, PGM or PPM files (data/file_list.h lists them, and caches the list). Every image is
// brought to `view` (data/image_view.h: its channels, and the centre view of rows x cols), decoded
// once into memory by `threads` threads; or, with `stream`, the list is kept and each batch's
// images are decoded when they are used (data/image_stream.h), in `view` (a random resized crop
// for training, if it says so). The images come in an order fixed by their paths, mixing the
// classes (so `limit` keeps some of each).
struct FolderOptions {
  ViewOptions view;
  // A file that is not a decodable image: skipped, and named in Folder::skipped (a streamed one:
  // in skipped_file, and another image decoded in its place); else the load fails naming it.
  bool skip_bad = true;
  // Streamed and skip_bad: a file that does not decode is left out of its batch (its label
  // kLeftOut, its pixels zero) instead of replaced by the next that does: a test split's figures
  // count each picture once, as a split decoded into memory (which leaves it out) does.
  bool leave_out_bad = false;
  // With holdout > 0 the folder is split by a hash of each image's path: the fraction `holdout`
  // is the test split (test: true), the rest the training split. The same folder splits the same
  // way on every worker and every run.
  double holdout = 0;
  bool test = false;
  // The classes the labels index; empty: the folder's own. A test folder takes the training
  // folder's, and a class it lacks is an error.
  std::vector<std::string> classes;
  int64_t limit = 0;  // keep the first N images (0: all)
  bool stream = false;
  int threads = 1;           // decode threads (and class folders listed at once, at least 8)
  std::string cache_dir;     // where file lists are kept ("" for nowhere)
  std::string skipped_file;  // streamed: where skipped files are named
  uint64_t seed = 0;         // streamed: the views' draws
};
struct Folder {
  ImageSet set;
  std::vector<std::string> classes;
  std::vector<std::string> skipped;  // "path: why"
  ListReport listing;
};
Result<Folder> LoadImageFolder(const std::string& dir, const FolderOptions& options);
// The class folders of `dir`, in name order; an error naming dir when it is no folder or holds
// fewer than 2 of them, or more than kMaxClasses.
Result<std::vector<std::string>> FolderClasses(const std::string& dir);
// The shape of the first picture of `dir`'s file list (channels 1 for a grey picture, else 3;
// its rows and cols): an image folder's `shape` when the spec leaves it out. `first` receives
// that picture's path.
Result<std::vector<int64_t>> FolderShape(const std::string& dir, std::string* first = nullptr);
// One image set's images with `channels` (1: luma, ITU-R BT.601; 3: grey repeated).
ImageSet ToChannels(const ImageSet& set, int channels);

// Checks, without reading them, that the files a dataset needs are in `dir` ("fashion-mnist" and
// "mnist": the four idx files, raw or gzipped; "cifar10": data_batch_1..5.bin and test_batch.bin),
// so a job with a wrong path fails before it starts. The error names the first missing file.
Status CheckDataDir(const std::string& dataset, const std::string& dir);

// Where Debian's dataset-fashion-mnist package puts the real data.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Fashion-MNIST's class names, index = label.
const std::vector<std::string>& FashionMnistClasses();

}  // namespace trainctl::data
