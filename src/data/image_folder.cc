// A folder per class of image files (data/dataset.h): decoded once into one ImageSet, or streamed.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "common/strings.h"
#include "data/dataset.h"
#include "data/file_list.h"
#include "data/image_rows.h"
#include "data/image_stream.h"

namespace trainctl::data {

Result<std::vector<std::string>> FolderClasses(const std::string& dir) { return ListClassFolders(dir); }

Result<std::vector<int64_t>> FolderShape(const std::string& dir, std::string* first) {
  ListOptions o;
  o.cache_dir = DefaultListCacheDir();
  ASSIGN_OR_RETURN(FileList list, ListImageFolder(dir, o));
  // The first in the list's order that decodes (a broken file is the stream's to skip).
  std::string bytes;
  for (int64_t i = 0; i < std::min<int64_t>(list.size(), 16); ++i) {
    const std::string path = list.Path(i);
    if (!ReadPicture(path, &bytes).ok()) continue;
    auto one = DecodeImage(bytes, path);
    if (!one.ok()) continue;
    if (first) *first = path;
    return std::vector<int64_t>{one->channels == 1 ? 1 : 3, one->rows, one->cols};
  }
  return InvalidArgument(dir + ": none of its first pictures decodes; give trainer.data.shape");
}

ImageSet ToChannels(const ImageSet& set, int channels) {
  if (set.channels == channels) return set;
  const int64_t plane = int64_t{set.rows} * set.cols;
  ImageSet out = set;
  out.channels = channels;
  out.pixels.assign(set.count * channels * plane, 0);
  for (int64_t i = 0; i < set.count; ++i) {
    const uint8_t* src = set.image(i);
    uint8_t* dst = out.pixels.data() + i * channels * plane;
    for (int64_t k = 0; k < plane; ++k) {
      if (channels == 1) {  // RGB to luma (ITU-R BT.601)
        dst[k] = Luma(src[k], src[plane + k], src[2 * plane + k]);
      } else {
        for (int c = 0; c < channels; ++c) dst[c * plane + k] = src[k];
      }
    }
  }
  return out;
}

Result<Folder> LoadImageFolder(const std::string& dir, const FolderOptions& o) {
  Folder f;
  ListOptions lo;
  lo.classes = o.classes;
  lo.cache_dir = o.cache_dir;
  lo.threads = std::max(8, o.threads);
  lo.holdout = o.holdout;
  lo.test = o.test;
  lo.limit = o.stream ? o.limit : 0;  // in memory, the first `limit` images that decode
  ASSIGN_OR_RETURN(FileList list, ListImageFolder(dir, lo, &f.listing));
  f.classes = list.classes();
  ImageSet& set = f.set;
  set.channels = o.view.channels;
  set.rows = o.view.rows;
  set.cols = o.view.cols;
  set.num_classes = static_cast<int>(f.classes.size());
  set.class_names = f.classes;
  auto none = [&] {
    return InvalidArgument(
        dir + ": no image in its class folders" +
        (o.holdout > 0 ? std::string(o.test ? " held out for testing" : " left for training") : "") +
        (f.skipped.empty() ? "; expected PNG, JPEG, PGM or PPM files" : "; skipped: " + f.skipped[0]));
  };
  if (list.size() == 0) return none();
  if (o.stream) {
    set.count = list.size();
    set.labels = list.labels();
    StreamOptions so;
    so.view = o.view;
    so.threads = o.threads;
    so.fail_on_bad = !o.skip_bad;
    so.leave_out_bad = o.leave_out_bad;
    so.skipped_file = o.skipped_file;
    so.seed = o.seed;
    set.stream = std::make_shared<ImageStream>(std::make_shared<const FileList>(std::move(list)), so);
    return f;
  }
  // Every image once, in its centre view, `threads` at a time; those that do not decode left out.
  ViewOptions centre = o.view;
  centre.random_resized_crop = false;
  const int64_t bytes = set.image_bytes(), n = list.size();
  std::vector<uint8_t> pixels(static_cast<size_t>(n * bytes));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::atomic<int64_t> next{0}, good{0};
  auto work = [&] {
    std::string file;
    while (o.limit <= 0 || good.load() < o.limit) {  // with enough, the rest is not read
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      const std::string path = list.Path(i);
      Status st = ReadPicture(path, &file);
      if (st.ok()) st = DecodeView(file, path, centre, 0, pixels.data() + i * bytes);
      if (st.ok()) {
        ++good;
      } else {
        errors[static_cast<size_t>(i)] = st.message();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, o.threads); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  const int64_t read = std::min(n, next.load());  // every image before it was read
  for (int64_t i = 0; i < read && (o.limit <= 0 || set.count < o.limit); ++i) {
    const std::string& error = errors[static_cast<size_t>(i)];
    if (!error.empty()) {
      if (!o.skip_bad) return InvalidArgument(error + " (data.bad_images: fail)");
      f.skipped.push_back(error);
      continue;
    }
    if (set.count != i)
      std::memmove(pixels.data() + set.count * bytes, pixels.data() + i * bytes, static_cast<size_t>(bytes));
    set.labels.push_back(list.Label(i));
    ++set.count;
  }
  pixels.resize(static_cast<size_t>(set.count * bytes));
  pixels.shrink_to_fit();
  set.pixels = std::move(pixels);
  if (set.count == 0) return none();
  return f;
}

}  // namespace trainctl::data
