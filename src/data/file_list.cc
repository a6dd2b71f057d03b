#include "data/file_list.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>

#include "common/duration.h"
#include "common/fs.h"
#include "common/sha256.h"
#include "common/strings.h"

namespace trainctl::data {
namespace {

// FNV-1a, 64 bits: the order and the holdout split, from the path inside the folder.
uint64_t Hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The names in `dir` (hidden ones left out), sorted: its folders, or its files.
Result<std::vector<std::string>> Names(const std::string& dir, bool folders) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return NotFound(dir + ": " + std::strerror(errno) + "; expected a folder of class folders");
  std::vector<std::string> out;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.' || std::strchr(e->d_name, '\n')) continue;
    bool dir_entry = e->d_type == DT_DIR, file_entry = e->d_type == DT_REG;
    if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {  // some file systems, and links: ask
      struct stat st{};
      if (::stat((dir + "/" + e->d_name).c_str(), &st) != 0) continue;
      dir_entry = S_ISDIR(st.st_mode);
      file_entry = S_ISREG(st.st_mode);
    }
    if (folders ? dir_entry : file_entry && IsImageName(e->d_name)) out.push_back(e->d_name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string MtimeOf(const std::string& dir) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return "";
  return std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
}

// One class folder's image files, and when the folder was last changed.
struct ClassFiles {
  std::string mtime;
  std::vector<std::string> files;
};

// The cache file: "trainctl file list 1", the folder, then per class "MTIME COUNT NAME" and its
// COUNT file names, a line each.
std::map<std::string, ClassFiles> ReadCache(const std::string& path, const std::string& root) {
  std::map<std::string, ClassFiles> out;
  auto text = ReadFile(path, int64_t{1} << 30);
  if (!text.ok()) return out;
  std::istringstream in(*text);
  std::string line;
  if (!std::getline(in, line) || line != "trainctl file list 1" || !std::getline(in, line) || line != root) return {};
  while (std::getline(in, line)) {
    std::istringstream head(line);
    std::string mtime;
    int64_t count = -1;
    head >> mtime >> count;
    std::string name;
    std::getline(head, name);
    if (count < 0 || name.size() < 2) return {};
    ClassFiles& c = out[name.substr(1)];
    c.mtime = mtime;
    c.files.reserve(static_cast<size_t>(std::min<int64_t>(count, 1 << 24)));
    for (int64_t i = 0; i < count; ++i) {
      if (!std::getline(in, line)) return {};
      c.files.push_back(line);
    }
  }
  return out;
}

std::string CachePath(const std::string& cache_dir, const std::string& root) {
  return cache_dir + "/" + Sha256Hex(root).substr(0, 24) + ".list";
}

}  // namespace

Result<std::vector<std::string>> ListClassFolders(const std::string& dir, int least) {
  ASSIGN_OR_RETURN(std::vector<std::string> own, Names(dir, true));
  if (static_cast<int>(own.size()) < least) {
    return InvalidArgument(dir + ": " + std::to_string(own.size()) + " class folder(s); expected a folder per "
                           "class, at least " + std::to_string(least) + " (dir/cat/1.png, dir/dog/2.jpg)");
  }
  if (own.size() > kMaxClasses) {
    return InvalidArgument(dir + ": " + std::to_string(own.size()) + " class folders; at most " +
                           std::to_string(kMaxClasses));
  }
  return own;
}

bool IsImageName(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* ext : {".png", ".jpg", ".jpeg", ".pgm", ".ppm", ".pnm"}) {
    const size_t n = std::strlen(ext);
    if (lower.size() > n && lower.compare(lower.size() - n, n, ext) == 0) return true;
  }
  return false;
}

std::string DefaultListCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/') return std::string(xdg) + "/trainctl/lists";
  if (const char* home = std::getenv("HOME"); home && home[0] == '/') return std::string(home) + "/.cache/trainctl/lists";
  return "";
}

class FileListBuilder {
 public:
  static Result<FileList> Build(const std::string& dir, const ListOptions& o, ListReport* report) {
    const auto start = Clock::now();
    std::error_code ec;
    const std::string root = std::filesystem::absolute(dir, ec).lexically_normal().string();
    ASSIGN_OR_RETURN(std::vector<std::string> own, ListClassFolders(root, o.classes.empty() ? 2 : 1));
    FileList list;
    list.root_ = root;
    list.classes_ = o.classes.empty() ? own : o.classes;
    std::map<std::string, uint16_t> label_of;
    for (size_t i = 0; i < list.classes_.size(); ++i) label_of[list.classes_[i]] = static_cast<uint16_t>(i);
    for (const auto& cls : own) {
      if (!label_of.count(cls)) {
        return InvalidArgument(root + "/" + cls + ": a class the training folder does not have; expected one of " +
                               Join(list.classes_, ", "));
      }
    }
    // Each class folder's files: from the cache while the folder is unchanged, else read afresh.
    const std::string cache = o.cache_dir.empty() ? "" : CachePath(o.cache_dir, root);
    std::map<std::string, ClassFiles> cached = cache.empty() ? std::map<std::string, ClassFiles>{} : ReadCache(cache, root);
    std::vector<ClassFiles> files(own.size());
    std::vector<std::string> errors(own.size());
    std::atomic<size_t> next{0};
    std::atomic<int> listed{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < own.size();) {
        const std::string path = root + "/" + own[i];
        files[i].mtime = MtimeOf(path);
        auto it = cached.find(own[i]);
        if (it != cached.end() && !files[i].mtime.empty() && it->second.mtime == files[i].mtime) {
          files[i].files = std::move(it->second.files);
          continue;
        }
        auto names = Names(path, false);
        if (!names.ok()) {
          errors[i] = names.status().message();
          continue;
        }
        files[i].files = std::move(*names);
        listed.fetch_add(1);
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < std::min<int>(std::max(1, o.threads), static_cast<int>(own.size())); ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (size_t i = 0; i < own.size(); ++i) {
      if (!errors[i].empty()) return NotFound(errors[i]);
      if (files[i].files.empty()) {
        return InvalidArgument(root + "/" + own[i] + ": an empty class folder (no PNG, JPEG, PGM or PPM file); "
                               "remove it, or put its images in it");
      }
    }
    if (!cache.empty() && listed.load() > 0) {
      std::string text = "trainctl file list 1\n" + root + "\n";
      for (size_t i = 0; i < own.size(); ++i) {
        text += files[i].mtime + " " + std::to_string(files[i].files.size()) + " " + own[i] + "\n";
        for (const auto& f : files[i].files) text += f + "\n";
      }
      if (MakeDirs(o.cache_dir).ok()) (void)AtomicWriteFile(cache, text);  // a cache: best effort
    }
    // The order: a hash of each path inside the folder (then the path), the holdout by it too.
    struct Item {
      uint64_t order;
      uint32_t cls, file;
    };
    std::vector<Item> items;
    for (size_t c = 0; c < own.size(); ++c) {
      for (size_t f = 0; f < files[c].files.size(); ++f) {
        const std::string rel = own[c] + "/" + files[c].files[f];
        const uint64_t h = Hash(rel);
        if (o.holdout > 0 && (double(h >> 11) * 0x1.0p-53 < o.holdout) != o.test) continue;
        items.push_back({h, static_cast<uint32_t>(c), static_cast<uint32_t>(f)});
      }
    }
    auto rel_less = [&](const Item& a, const Item& b) {
      if (a.order != b.order) return a.order < b.order;
      return std::tie(own[a.cls], files[a.cls].files[a.file]) < std::tie(own[b.cls], files[b.cls].files[b.file]);
    };
    std::sort(items.begin(), items.end(), rel_less);
    if (o.limit > 0 && static_cast<int64_t>(items.size()) > o.limit) items.resize(static_cast<size_t>(o.limit));
    list.labels_.reserve(items.size());
    list.starts_.reserve(items.size() + 1);
    for (const Item& it : items) {
      list.names_ += own[it.cls];
      list.names_ += '/';
      list.names_ += files[it.cls].files[it.file];
      list.names_ += '\0';
      if (list.names_.size() > UINT32_MAX) return InvalidArgument(root + ": too many files' names to hold (4 GiB)");
      list.starts_.push_back(static_cast<uint32_t>(list.names_.size()));
      list.labels_.push_back(label_of[own[it.cls]]);
    }
    list.names_.shrink_to_fit();
    if (report) {
      report->listed = listed.load();
      report->from_cache = listed.load() == 0 && !cached.empty();
      report->seconds = SecondsSince(start);
    }
    return list;
  }
};

Result<FileList> ListImageFolder(const std::string& dir, const ListOptions& options, ListReport* report) {
  return FileListBuilder::Build(dir, options, report);
}

void FileList::Truncate(int64_t n) {
  if (n < 0 || n >= size()) return;
  names_.resize(starts_[n]);
  starts_.resize(static_cast<size_t>(n) + 1);
  labels_.resize(static_cast<size_t>(n));
}

}  // namespace trainctl::data
