#include "common/plugin.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <vector>

#include "common/fs.h"
#include "common/subprocess.h"

namespace trainctl {

Result<void*> PluginSymbol(const std::string& file, const std::string& symbol) {
  static std::mutex mu;
  static std::map<std::string, void*> loaded;  // file -> handle, never closed
  std::lock_guard<std::mutex> lock(mu);
  void*& handle = loaded[file];
  if (!handle) {
    std::string looked;
    const std::string exe = SelfExe();
    const std::string dir = exe.substr(0, exe.rfind('/'));
    std::vector<std::string> candidates = {dir + "/" + file, dir + "/../lib/trainctl/" + file};
#ifdef TRAINCTL_BUILD_DIR
    if (exe.rfind(TRAINCTL_BUILD_DIR "/", 0) == 0) candidates.push_back(TRAINCTL_BUILD_DIR "/src/" + file);
#endif
    for (const auto& path : candidates) {
      looked += "\n  " + path;
      if (!Exists(path)) {
        looked += ": no such file";
        continue;
      }
      handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      looked += std::string(": ") + ::dlerror();
    }
    if (!handle) return NotFound("cannot load " + file + "; looked in:" + looked);
  }
  void* address = ::dlsym(handle, symbol.c_str());
  if (!address) return NotFound(file + " has no entry point " + symbol + " (is it from another build of trainctl?)");
  return address;
}

}  // namespace trainctl
