#include "data/image_stream.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/cpus.h"
#include "common/fs.h"

namespace trainctl::data {
namespace {

constexpr int64_t kMaxFileBytes = int64_t{64} << 20;  // a picture's file; more is not a picture
constexpr int kTries = 16;                            // files tried in place of one that fails

int64_t Ns(double seconds) { return static_cast<int64_t>(seconds * 1e9); }

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

Status ReadPicture(const std::string& path, std::string* bytes) {
  struct stat st {};
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, &st));
  if (st.st_size > kMaxFileBytes) {
    ::close(fd);
    return InvalidArgument(path + ": " + std::to_string(st.st_size) + " bytes, more than a picture's 64 MiB");
  }
  bytes->resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes->size()) {
    const ssize_t n = ::pread(fd, bytes->data() + got, bytes->size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  bytes->resize(got);
  return Status::Ok();
}

Status RecordSkipped(const std::string& file, const std::vector<std::string>& lines) {
  if (lines.empty() || file.empty()) return Status::Ok();
  const std::string dir = std::filesystem::path(file).parent_path().string();
  if (!dir.empty()) RETURN_IF_ERROR(MakeDirs(dir));
  // In the run's directory: a FIFO or a device planted there must not stall the decode thread
  // that reads it (opened without blocking, refused unless it is a regular file).
  const int fd =
      ::open(file.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644);
  if (fd < 0) return Internal(file + ": cannot open: " + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return InvalidArgument(file + " is not a regular file; the skipped pictures are not named in it");
  }
  // Every rank of the job appends to the one file: under its lock, each line once.
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  auto have = ReadAll(fd, file, int64_t{64} << 20);
  Status st = have.ok() ? Status::Ok() : have.status();
  std::string add;
  if (st.ok()) {
    std::set<std::string_view> seen;
    for (std::string_view rest = *have; !rest.empty();) {
      const size_t end = rest.find('\n');
      seen.insert(rest.substr(0, end));
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
    for (const auto& line : lines) {
      if (seen.insert(line).second) add += line + "\n";
    }
  }
  for (size_t done = 0; st.ok() && done < add.size();) {
    const ssize_t n = ::write(fd, add.data() + done, add.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) st = Internal(file + ": cannot write: " + std::strerror(errno));
    if (n > 0) done += static_cast<size_t>(n);
  }
  ::close(fd);  // (and the lock with it)
  return st;
}

int DefaultDecodeThreads(int workers) { return std::max(1, UsableCpus() / std::max(1, workers)); }

ImageStream::ImageStream(std::shared_ptr<const FileList> list, StreamOptions options)
    : list_(std::move(list)), o_(std::move(options)) {}

ImageStream::~ImageStream() { Stop(); }

void ImageStream::Configure(int threads, uint64_t seed, const std::string& skipped_file) {
  Stop();
  o_.threads = std::max(1, threads);
  o_.seed = seed;
  o_.skipped_file = skipped_file;
  // What was skipped before there was a file to name it in (a loader's first picture) goes there now.
  std::lock_guard<std::mutex> lock(mu_);
  if (Status st = RecordSkipped(o_.skipped_file, skipped_new_); !st.ok() && skip_error_.empty())
    skip_error_ = st.message();
}

void ImageStream::Start() {
  owner_ = ::getpid();
  stop_ = false;
  for (int t = 0; t < std::max(1, o_.threads); ++t) threads_.emplace_back([this] { Work(); });
}

void ImageStream::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (threads_.empty()) return;
    stop_ = true;
  }
  work_.notify_all();
  if (owner_ == ::getpid()) {
    for (auto& t : threads_) t.join();
  } else {
    for (auto& t : threads_) t.detach();  // a fork's copy of the objects: no such threads here
  }
  threads_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
  ahead_.reset();
}

void ImageStream::Work() {
  while (true) {
    std::shared_ptr<Batch> batch;
    int64_t i = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      std::tie(batch, i) = std::move(queue_.front());
      queue_.pop_front();
    }
    Decode(batch.get(), i);
    std::lock_guard<std::mutex> lock(mu_);
    if (--batch->pending == 0) done_.notify_all();
  }
}

void ImageStream::Decode(Batch* batch, int64_t i) {
  thread_local std::string bytes;
  const int64_t count = list_->size();
  uint8_t* out = batch->pixels.data() + i * image_bytes();
  int64_t at = batch->indices[static_cast<size_t>(i)];
  for (int attempt = 0; attempt < kTries; ++attempt, at = (at + 1) % count) {
    const std::string path = list_->Path(at);
    const double start = Now();
    Status st = ReadPicture(path, &bytes);
    const double read = Now();
    read_ns_ += Ns(read - start);
    ViewTimes times;
    if (st.ok()) st = DecodeView(bytes, path, o_.view, ImageDraw(o_.seed, batch->epoch, at), out, &times);
    decode_ns_ += Ns(times.decode);
    resize_ns_ += Ns(times.resize);
    if (st.ok()) {
      batch->labels[static_cast<size_t>(i)] = list_->Label(at);
      ++images_;
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++skips_;
      if (first_skip_.empty()) first_skip_ = st.message();
      if (skipped_seen_.insert(at).second) {
        skipped_new_.push_back(st.message());
        if (Status wrote = RecordSkipped(o_.skipped_file, {st.message()}); !wrote.ok() && skip_error_.empty()) {
          skip_error_ = wrote.message();
        }
      }
    }
    if (o_.fail_on_bad) {
      batch->errors[static_cast<size_t>(i)] = st.message() + " (data.bad_images: fail)";
      return;
    }
    if (o_.leave_out_bad) {
      std::memset(out, 0, static_cast<size_t>(image_bytes()));
      batch->labels[static_cast<size_t>(i)] = kLeftOut;
      return;
    }
  }
  batch->errors[static_cast<size_t>(i)] = "no picture decodes among " + std::to_string(kTries) + " files from " +
                                          list_->Path(batch->indices[static_cast<size_t>(i)]) + " on";
}

std::shared_ptr<ImageStream::Batch> ImageStream::Submit(const int64_t* indices, int64_t n, int64_t epoch) {
  auto b = std::make_shared<Batch>();
  b->indices.assign(indices, indices + n);
  b->epoch = epoch;
  b->pixels.resize(static_cast<size_t>(n * image_bytes()));
  b->labels.resize(static_cast<size_t>(n));
  b->errors.resize(static_cast<size_t>(n));
  b->pending = static_cast<int>(n);
  if (threads_.empty()) Start();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i = 0; i < n; ++i) queue_.emplace_back(b, i);
  }
  work_.notify_all();
  return b;
}

void ImageStream::Wait(Batch* batch) {
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return batch->pending == 0; });
}

void ImageStream::Prefetch(const int64_t* indices, int64_t n, int64_t epoch) {
  if (n <= 0) return;
  if (ahead_) {  // not taken: its images not yet begun need not be
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->first == ahead_) {
        --ahead_->pending;
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  ahead_ = Submit(indices, n, epoch);
}

Status ImageStream::Get(const int64_t* indices, int64_t n, int64_t epoch, uint8_t* out, uint16_t* labels) {
  std::shared_ptr<Batch> b;
  if (ahead_ && ahead_->epoch == epoch && static_cast<int64_t>(ahead_->indices.size()) == n &&
      std::equal(ahead_->indices.begin(), ahead_->indices.end(), indices)) {
    b = std::move(ahead_);
  } else {
    b = Submit(indices, n, epoch);
  }
  Wait(b.get());
  for (const auto& e : b->errors) {
    if (!e.empty()) return InvalidArgument(e);
  }
  std::memcpy(out, b->pixels.data(), b->pixels.size());
  std::memcpy(labels, b->labels.data(), b->labels.size() * sizeof(uint16_t));
  return Status::Ok();
}

std::vector<std::string> ImageStream::TakeSkipped() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.swap(skipped_new_);
  return out;
}

SkipCount ImageStream::TakeSkipCount() {
  std::lock_guard<std::mutex> lock(mu_);
  SkipCount c{skips_, std::move(first_skip_), std::move(skip_error_)};
  skips_ = 0;
  first_skip_.clear();
  skip_error_.clear();
  return c;
}

StreamStats ImageStream::Stats() const {
  return {images_.load(), read_ns_.load() / 1e9, decode_ns_.load() / 1e9, resize_ns_.load() / 1e9};
}

}  // namespace trainctl::data
