#include "data/file_list.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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
      struct stat st {};
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

// What identifies a class folder's contents: its device, inode and modification time (to the
// nanosecond), which adding, removing or renaming a file in it changes; another folder extracted
// at the same path with the same times has another inode.
std::string StampOf(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

constexpr const char* kListFormat = "trainctl file list 2";
constexpr int64_t kMaxListBytes = int64_t{1} << 30;

// A name read from a list: a file or folder name as readdir gives it, never a path.
bool PlainName(std::string_view n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string_view::npos &&
         n.find('\0') == std::string_view::npos;
}

}  // namespace

std::map<std::string, CachedFolder> ParseFileList(const std::string& text, const std::string& root) {
  std::map<std::string, CachedFolder> out;
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kListFormat || !std::getline(in, line) || line != root) return {};
  int64_t names = 0;
  while (std::getline(in, line)) {
    std::istringstream head(line);
    std::string stamp;
    int64_t count = -1;
    head >> stamp >> count;
    std::string name;
    std::getline(head, name);
    // Each name takes at least two bytes of the file (a letter and its line feed).
    if (count < 1 || (names += count) > static_cast<int64_t>(text.size()) / 2 || name.size() < 2 || name[0] != ' ' ||
        !PlainName(std::string_view(name).substr(1)) || out.count(name.substr(1))) {
      return {};
    }
    CachedFolder& folder = out[name.substr(1)];
    folder.stamp = stamp;
    folder.files.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      if (!std::getline(in, line) || !PlainName(line) || !IsImageName(line)) return {};
      folder.files.push_back(line);
    }
  }
  return out;
}

namespace {

std::string ListName(const std::string& root) { return Sha256Hex(root).substr(0, 24) + ".list"; }

// The cache's directory, open (following no link) and checked: this user's own and writable by
// no one else; made private (0700) when it is ours and only readable by others (as trainctl made
// it before). Made, private, when missing. -1 and `why` when it is refused.
int OpenCacheDir(const std::string& dir, std::string* why) {
  const std::filesystem::path p(dir);
  const std::string top = p.parent_path().parent_path().string();
  if (!top.empty() && !MakeDirs(top).ok()) {
    *why = "cannot create " + top;
    return -1;
  }
  ::mkdir(p.parent_path().c_str(), 0700);
  ::mkdir(dir.c_str(), 0700);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    const int err = errno;
    *why = dir + ": " + std::strerror(err) + (err == ELOOP || err == ENOTDIR ? " (a link is not followed)" : "");
    if (fd >= 0) ::close(fd);
    return -1;
  }
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (st.st_uid != ::geteuid()) {
    *why = dir + " belongs to user " + std::to_string(st.st_uid) + ", not to you";
  } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    *why = dir + " can be written by other users (mode " + mode + "), who could plant lists in it";
  } else if ((st.st_mode & 077) != 0 && ::fchmod(fd, 0700) != 0) {
    *why = dir + " can be read by other users (mode " + mode + ") and cannot be made private";
  } else {
    return fd;
  }
  ::close(fd);
  return -1;
}

// The list in the cache directory: a regular file of this user's that no one else can write,
// at most kMaxListBytes; "" when there is none or it is not to be trusted.
std::string ReadList(int dir_fd, const std::string& name) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  Result<std::string> text = std::string();
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
      (st.st_mode & (S_IWGRP | S_IWOTH)) == 0) {
    text = ReadAll(fd, name, kMaxListBytes);
  }
  ::close(fd);
  return text.ok() ? *text : std::string();
}

}  // namespace

Result<std::vector<std::string>> ListClassFolders(const std::string& dir, int least) {
  ASSIGN_OR_RETURN(std::vector<std::string> own, Names(dir, true));
  if (static_cast<int>(own.size()) < least) {
    return InvalidArgument(dir + ": " + std::to_string(own.size()) +
                           " class folder(s); expected a folder per "
                           "class, at least " +
                           std::to_string(least) + " (dir/cat/1.png, dir/dog/2.jpg)");
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
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/')
    return std::string(xdg) + "/trainctl/lists";
  if (const char* home = std::getenv("HOME"); home && home[0] == '/')
    return std::string(home) + "/.cache/trainctl/lists";
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
    std::string refused;
    const int cache_fd = o.cache_dir.empty() ? -1 : OpenCacheDir(o.cache_dir, &refused);
    struct Closer {
      int fd;
      ~Closer() {
        if (fd >= 0) ::close(fd);
      }
    } closer{cache_fd};
    const std::string list_name = ListName(root);
    std::map<std::string, CachedFolder> cached;
    if (cache_fd >= 0) cached = ParseFileList(ReadList(cache_fd, list_name), root);
    std::vector<CachedFolder> files(own.size());
    std::vector<std::string> errors(own.size());
    std::atomic<size_t> next{0};
    std::atomic<int> listed{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < own.size();) {
        const std::string path = root + "/" + own[i];
        files[i].stamp = StampOf(path);
        auto it = cached.find(own[i]);
        if (it != cached.end() && !files[i].stamp.empty() && it->second.stamp == files[i].stamp) {
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
    for (int t = 1; t < std::min<int>(std::max(1, o.threads), static_cast<int>(own.size())); ++t)
      pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (size_t i = 0; i < own.size(); ++i) {
      if (!errors[i].empty()) return NotFound(errors[i]);
      if (files[i].files.empty()) {
        return InvalidArgument(root + "/" + own[i] +
                               ": an empty class folder (no PNG, JPEG, PGM or PPM file); "
                               "remove it, or put its images in it");
      }
    }
    if (cache_fd >= 0 && listed.load() > 0) {
      std::string text = std::string(kListFormat) + "\n" + root + "\n";
      for (size_t i = 0; i < own.size(); ++i) {
        text += files[i].stamp + " " + std::to_string(files[i].files.size()) + " " + own[i] + "\n";
        for (const auto& f : files[i].files) text += f + "\n";
      }
      (void)AtomicWriteFileAt(cache_fd, o.cache_dir, list_name, text, 0600);  // a cache: best effort
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
      if (!refused.empty()) report->cache_refused = refused + "; listing the folder without the cache";
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
