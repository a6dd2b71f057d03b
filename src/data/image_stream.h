// An image folder read as it is used: each batch's files read and decoded when the batch is
// asked for (the next batch's ahead of time, while this one computes), by a pool of decode
// threads of the process's own, none of the pixels kept. The memory it takes does not grow with
// the number of images: the file list (about 40 bytes a file) and two batches being decoded.
//
// Threads: the pool starts with the first Prefetch or Get, in the process that calls it (not in a
// worker server: its copies, forked, start their own); Stop() ends it. Prefetch, Get and
// TakeSkipped from one thread (the training loop's); Stats from any.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "data/file_list.h"
#include "data/image_view.h"

namespace trainctl::data {

struct StreamOptions {
  ViewOptions view;
  int threads = 1;
  // A file that does not decode (or declares more than 2^26 pixels): skipped, and the next file of
  // the list that does decode is taken in its place (the batch keeps its size; its label comes
  // with it), or with fail_on_bad, Get fails naming it.
  bool fail_on_bad = false;
  // Instead of the next file: the image is left out, its label kLeftOut and its pixels zero (a
  // test split, whose every picture counts once).
  bool leave_out_bad = false;
  // Where the names of skipped files are appended, each once, whichever process of the job
  // skipped it (RecordSkipped; "" for nowhere).
  std::string skipped_file;
  uint64_t seed = 0;  // the views' draws: ImageDraw(seed, epoch, index)
};

// The label of an image a batch leaves out (StreamOptions::leave_out_bad): no class.
constexpr uint16_t kLeftOut = 0xFFFF;

// The files skipped since the last TakeSkipCount, each time one was (a file skipped in every
// epoch counts in each), the first of them, and why they could not be named in the file.
struct SkipCount {
  int64_t count = 0;
  std::string first;
  std::string file_error;
};

// Per stage, seconds of thread time, summed over the pool's threads, and the images done.
struct StreamStats {
  int64_t images = 0;
  double read = 0, decode = 0, resize = 0;
};

class ImageStream {
 public:
  ImageStream(std::shared_ptr<const FileList> list, StreamOptions options);
  ~ImageStream();
  ImageStream(const ImageStream&) = delete;
  ImageStream& operator=(const ImageStream&) = delete;

  const FileList& list() const { return *list_; }
  const StreamOptions& options() const { return o_; }
  int64_t image_bytes() const { return int64_t{o_.view.channels} * o_.view.rows * o_.view.cols; }

  // Starts decoding images `indices[0..n)` of `epoch` (each its view, drawn from the seed, the
  // epoch and the index) for a Get with the same arguments. One batch ahead at most: a Prefetch
  // replaces the one before it that no Get has taken.
  void Prefetch(const int64_t* indices, int64_t n, int64_t epoch);
  // Images `indices[0..n)` of `epoch` into `out` (n x image_bytes()) and their labels into
  // `labels`: what the matching Prefetch decoded, or decoded now, in parallel.
  Status Get(const int64_t* indices, int64_t n, int64_t epoch, uint8_t* out, uint16_t* labels);
  // The names of the files skipped since the last call (each file once per process).
  std::vector<std::string> TakeSkipped();
  SkipCount TakeSkipCount();
  StreamStats Stats() const;
  // Ends the pool's threads (they start again when needed): before a worker server forks.
  void Stop();
  // What the process that uses the stream decides (a worker, after a server loaded the list): its
  // threads, the run's seed, and where skipped files are named. Before the first Get or Prefetch.
  void Configure(int threads, uint64_t seed, const std::string& skipped_file);

 private:
  struct Batch {
    std::vector<int64_t> indices;
    int64_t epoch = 0;
    std::vector<uint8_t> pixels;
    std::vector<uint16_t> labels;
    std::vector<std::string> errors;  // per image: "" or why its file (and those after it) failed
    int pending = 0;                  // images not yet done (under mu_)
  };
  void Start();
  void Work();
  void Decode(Batch* batch, int64_t i);
  std::shared_ptr<Batch> Submit(const int64_t* indices, int64_t n, int64_t epoch);
  void Wait(Batch* batch);

  std::shared_ptr<const FileList> list_;
  StreamOptions o_;
  std::mutex mu_;
  std::condition_variable work_, done_;
  std::deque<std::pair<std::shared_ptr<Batch>, int64_t>> queue_;  // (batch, image) to decode
  std::shared_ptr<Batch> ahead_;                                  // Prefetch's
  std::vector<std::thread> threads_;
  pid_t owner_ = 0;  // the process whose threads these are
  bool stop_ = false;
  std::set<int64_t> skipped_seen_;
  std::vector<std::string> skipped_new_;
  int64_t skips_ = 0;  // under mu_, as the two below
  std::string first_skip_, skip_error_;
  std::atomic<int64_t> images_{0}, read_ns_{0}, decode_ns_{0}, resize_ns_{0};
};

// Appends to `file` each of `lines` it does not hold yet, under an exclusive lock of the file:
// the processes of a job that skip pictures share one list, each name in it once.
Status RecordSkipped(const std::string& file, const std::vector<std::string>& lines);

// Reads the picture file at `path` whole into `bytes` (reused: no allocation once it is large
// enough), opened without blocking, a regular file of at most 64 MiB.
Status ReadPicture(const std::string& path, std::string* bytes);

// The decode threads a worker gets by default: the CPUs it may use (affinity and quota) shared
// among `workers` on this machine, at least 1.
int DefaultDecodeThreads(int workers);

}  // namespace trainctl::data
