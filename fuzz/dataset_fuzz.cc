// libFuzzer target: a dataset file's bytes, as the trainer reads them (idx image and label files
// and CIFAR-10 batches, each raw or gzipped, told apart by content). The first byte picks the
// reader; the rest is the file. A set that loads must be as large as its files say.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "data/dataset.h"

namespace {

// The file the readers open (they take paths): an in-memory file of this process, which nothing
// has to remove.
const std::string& Path() {
  static const std::string path = [] {
    const int fd = ::memfd_create("dataset", 0);
    if (fd < 0) std::abort();
    return "/proc/self/fd/" + std::to_string(fd);
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl;
  if (size < 1) return 0;
  FILE* f = std::fopen(Path().c_str(), "wb");
  if (!f) std::abort();
  if (size > 1 && std::fwrite(data + 1, 1, size - 1, f) != size - 1) std::abort();
  std::fclose(f);
  // The same file as images and labels: only a file that is both can load, but every header
  // and gzip stream goes through the readers.
  auto set = data[0] % 2 == 0 ? data::LoadIdx(Path(), Path()) : data::LoadCifar10({Path()});
  if (!set.ok()) return 0;
  if (set->pixels.size() != static_cast<size_t>(set->count * set->image_bytes()) ||
      set->labels.size() != static_cast<size_t>(set->count)) {
    std::abort();
  }
  return 0;
}
