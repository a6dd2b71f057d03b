// A folder per class of image files, decoded into one ImageSet (data/dataset.h).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "common/strings.h"
#include "data/dataset.h"

namespace trainctl::data {
namespace {

// The names in a directory, sorted; hidden ones left out.
Result<std::vector<std::string>> List(const std::string& dir, bool folders) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return NotFound(dir + ": " + std::strerror(errno) + "; expected a folder of class folders");
  std::vector<std::string> out;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    struct stat st{};
    const std::string path = dir + "/" + e->d_name;
    if (::stat(path.c_str(), &st) != 0) continue;
    if (folders ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)) out.push_back(e->d_name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool ImageName(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* ext : {".png", ".jpg", ".jpeg", ".pgm", ".ppm", ".pnm"}) {
    const size_t n = std::strlen(ext);
    if (lower.size() > n && lower.compare(lower.size() - n, n, ext) == 0) return true;
  }
  return false;
}

// FNV-1a, 64 bits: the order and the holdout split, from the path inside the folder.
uint64_t Hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

Result<std::vector<std::string>> FolderClasses(const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> classes, List(dir, true));
  if (classes.size() < 2) {
    return InvalidArgument(dir + ": " + std::to_string(classes.size()) + " class folder(s); expected a folder per "
                           "class, at least 2 (dir/cat/1.png, dir/dog/2.jpg)");
  }
  if (classes.size() > 256) return InvalidArgument(dir + ": " + std::to_string(classes.size()) + " class folders; at most 256");
  return classes;
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
        dst[k] = static_cast<uint8_t>((299 * src[k] + 587 * src[plane + k] + 114 * src[2 * plane + k] + 500) / 1000);
      } else {
        for (int c = 0; c < channels; ++c) dst[c * plane + k] = src[k];
      }
    }
  }
  return out;
}

ImageSet ResizeCrop(const ImageSet& one, int rows, int cols) {
  if (one.rows == rows && one.cols == cols) return one;
  // The scale at which the image covers rows x cols; the crop's top-left corner in the scaled image.
  const double scale = std::max(double(rows) / one.rows, double(cols) / one.cols);
  const double top = (one.rows * scale - rows) / 2, left = (one.cols * scale - cols) / 2;
  ImageSet out;
  out.count = 1;
  out.channels = one.channels;
  out.rows = rows;
  out.cols = cols;
  out.labels = one.labels;
  out.pixels.resize(int64_t{one.channels} * rows * cols);
  for (int y = 0; y < rows; ++y) {
    const double sy = std::clamp((y + top + 0.5) / scale - 0.5, 0.0, double(one.rows - 1));
    const int y0 = static_cast<int>(sy), y1 = std::min(y0 + 1, one.rows - 1);
    const double fy = sy - y0;
    for (int x = 0; x < cols; ++x) {
      const double sx = std::clamp((x + left + 0.5) / scale - 0.5, 0.0, double(one.cols - 1));
      const int x0 = static_cast<int>(sx), x1 = std::min(x0 + 1, one.cols - 1);
      const double fx = sx - x0;
      for (int c = 0; c < one.channels; ++c) {
        const uint8_t* p = one.pixels.data() + int64_t{c} * one.rows * one.cols;
        const double v = (1 - fy) * ((1 - fx) * p[y0 * one.cols + x0] + fx * p[y0 * one.cols + x1]) +
                         fy * ((1 - fx) * p[y1 * one.cols + x0] + fx * p[y1 * one.cols + x1]);
        out.pixels[(int64_t{c} * rows + y) * cols + x] = static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 255.0)));
      }
    }
  }
  return out;
}

Result<Folder> LoadImageFolder(const std::string& dir, const FolderOptions& o) {
  Folder f;
  ASSIGN_OR_RETURN(std::vector<std::string> own, FolderClasses(dir));
  f.classes = o.classes.empty() ? own : o.classes;
  struct Item {
    uint64_t order;
    std::string path;
    uint8_t label;
  };
  std::vector<Item> items;
  for (const auto& cls : own) {
    const auto at = std::find(f.classes.begin(), f.classes.end(), cls);
    if (at == f.classes.end()) {
      return InvalidArgument(dir + "/" + cls + ": a class the training folder does not have; expected one of " +
                             Join(f.classes, ", "));
    }
    ASSIGN_OR_RETURN(std::vector<std::string> files, List(dir + "/" + cls, false));
    for (const auto& name : files) {
      if (!ImageName(name)) continue;
      const std::string rel = cls + "/" + name;
      const uint64_t h = Hash(rel);
      if (o.holdout > 0) {
        const bool held = double(h >> 11) * 0x1.0p-53 < o.holdout;
        if (held != o.test) continue;
      }
      items.push_back({h, dir + "/" + rel, static_cast<uint8_t>(at - f.classes.begin())});
    }
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return std::tie(a.order, a.path) < std::tie(b.order, b.path); });
  ImageSet& set = f.set;
  set.channels = o.channels;
  set.rows = o.rows;
  set.cols = o.cols;
  set.num_classes = static_cast<int>(f.classes.size());
  set.class_names = f.classes;
  const int64_t bytes = set.image_bytes();
  for (const Item& item : items) {
    if (o.limit > 0 && set.count == o.limit) break;
    auto image = ReadImageFile(item.path);
    if (!image.ok()) {
      if (!o.skip_bad) return InvalidArgument(image.status().message() + " (data.bad_images: fail)");
      f.skipped.push_back(image.status().message());
      continue;
    }
    ImageSet one = ResizeCrop(ToChannels(*image, o.channels), o.rows, o.cols);
    set.pixels.insert(set.pixels.end(), one.pixels.begin(), one.pixels.begin() + bytes);
    set.labels.push_back(item.label);
    ++set.count;
  }
  if (set.count == 0) {
    return InvalidArgument(dir + ": no image in its class folders" +
                           (o.holdout > 0 ? std::string(o.test ? " held out for testing" : " left for training") : "") +
                           (f.skipped.empty() ? "; expected PNG, JPEG, PGM or PPM files" : "; skipped: " + f.skipped[0]));
  }
  return f;
}

}  // namespace trainctl::data
