// An image folder's file list (torchvision's ImageFolder layout: a folder per class, its image
// files in it), listed once and kept: listing 1.28 M files on a network file system takes
// minutes, so the list is cached (ListOptions::cache_dir) and reused while no class folder has
// changed (its modification time, to the nanosecond, which adding, removing or renaming a file in
// it changes, and its device and inode); only the folders that changed are listed again, many at a
// time. The cache is the user's alone: its directory 0700 and its lists 0600, opened without
// following links; a directory another user owns or can write is not used (the folder is listed,
// and ListReport says why), and a list that fails any check (a name with '/' or "..", an empty
// one, counts past what the file can hold) is ignored and written anew.
//
// The names are held in one block (about 40 bytes a file: ImageNet's list is some 50 MB), not a
// string each.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl::data {

// At most this many classes (a label is 16 bits; ImageNet has 1000).
inline constexpr int kMaxClasses = 4096;

class FileList {
 public:
  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  const std::string& root() const { return root_; }
  const std::vector<std::string>& classes() const { return classes_; }
  // "class/name", relative to root().
  std::string_view Name(int64_t i) const {
    return std::string_view(names_).substr(starts_[i], starts_[i + 1] - starts_[i] - 1);
  }
  std::string Path(int64_t i) const { return root_ + "/" + std::string(Name(i)); }
  uint16_t Label(int64_t i) const { return labels_[i]; }
  const std::vector<uint16_t>& labels() const { return labels_; }
  // Keeps the files for which keep(i) is true, in order.
  template <class Keep>
  void Filter(Keep keep);
  // The first n files.
  void Truncate(int64_t n);

 private:
  friend class FileListBuilder;
  std::string root_;
  std::vector<std::string> classes_;
  std::string names_;                // each name, then '\0'
  std::vector<uint32_t> starts_{0};  // names_ offsets, size() + 1 of them
  std::vector<uint16_t> labels_;
};

struct ListOptions {
  // The classes the labels index; empty: the folder's own. A test folder takes the training
  // folder's: a class it lacks is an error, and so is one it has that training lacks.
  std::vector<std::string> classes;
  // Where the lists are kept ("" for none): one file per folder, named by a hash of its path; its
  // parent is made private too when missing.
  std::string cache_dir;
  int threads = 8;  // class folders listed at once
  // With holdout > 0, the folder is split by a hash of each file's path inside it: the fraction
  // `holdout` is the test split (test: true), the rest the training split; the same everywhere.
  double holdout = 0;
  bool test = false;
  int64_t limit = 0;  // the first N files of the order below (0: all)
};

// What ListImageFolder did, for the log.
struct ListReport {
  bool from_cache = false;    // every class folder's list came from the cache
  int listed = 0;             // class folders read afresh
  std::string cache_refused;  // why the cache directory was not used ("": it was, or none was asked)
  double seconds = 0;
};

// The image files (PNG, JPEG, PGM, PPM, by their names) of `dir`'s class folders, in an order
// fixed by a hash of their paths (mixing the classes, so that `limit` keeps some of each).
// Errors name the folder: not a folder, fewer than 2 classes, an empty class folder (torchvision
// refuses it too), a class the labels do not have.
Result<FileList> ListImageFolder(const std::string& dir, const ListOptions& options, ListReport* report = nullptr);

// The class folders of `dir` alone (not their files), in name order: an error naming `dir` when it
// is no folder or holds fewer than `least` of them (2 for a training folder; a test folder may
// hold one), or more than kMaxClasses.
Result<std::vector<std::string>> ListClassFolders(const std::string& dir, int least = 2);

// One class folder in a cached list: its stamp (device, inode, modification time) and its files.
struct CachedFolder {
  std::string stamp;
  std::vector<std::string> files;
};

// A cached list's text (the cache's reader, also for the fuzz target and the tests): class name
// -> its folder; {} when any check fails (the format line, the folder, names that are no plain
// file names or no image's, counts past what `text` can hold).
std::map<std::string, CachedFolder> ParseFileList(const std::string& text, const std::string& root);

// $XDG_CACHE_HOME/trainctl/lists, else ~/.cache/trainctl/lists.
std::string DefaultListCacheDir();

// Whether `name` is an image file by its extension (.png, .jpg, .jpeg, .pgm, .ppm, .pnm; any case).
bool IsImageName(const std::string& name);

template <class Keep>
void FileList::Filter(Keep keep) {
  std::string names;
  std::vector<uint32_t> starts{0};
  std::vector<uint16_t> labels;
  for (int64_t i = 0; i < size(); ++i) {
    if (!keep(i)) continue;
    names.append(Name(i));
    names.push_back('\0');
    starts.push_back(static_cast<uint32_t>(names.size()));
    labels.push_back(labels_[i]);
  }
  names_ = std::move(names);
  starts_ = std::move(starts);
  labels_ = std::move(labels);
}

}  // namespace trainctl::data
