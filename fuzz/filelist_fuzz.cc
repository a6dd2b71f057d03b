// libFuzzer target: a cached file list's bytes (data/file_list.h), which another user may have
// written. A list that parses names only plain image file names, never more than the bytes can
// hold.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/file_list.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl;
  const std::string text = "trainctl file list 2\n/r\n" + std::string(reinterpret_cast<const char*>(data), size);
  size_t names = 0;
  for (const auto& [cls, folder] : data::ParseFileList(text, "/r")) {
    if (cls.empty() || cls.find('/') != std::string::npos || cls == "..") std::abort();
    const auto& files = folder.files;
    for (const auto& f : files) {
      if (f.empty() || f.find('/') != std::string::npos || f == ".." || !data::IsImageName(f)) std::abort();
    }
    names += files.size();
  }
  if (names > text.size() / 2) std::abort();
  return 0;
}
