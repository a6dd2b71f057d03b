// TorchScript module files (.pt) are code: loading one runs what its author wrote (its methods,
// its __setstate__), with the rights of whoever loads it. So trainctl loads a module only from a
// path the user named (the spec's trainer.model.torchscript, eval's and predict's --torchscript)
// or the copy a run keeps in its own output directory, never a path taken from a checkpoint's
// metadata, and only a file no other user could have written (docs/security.md).
//
// ReadModuleFile reads such a file whole, once, so that what is checked, hashed and loaded are
// the same bytes: a regular file (opened without blocking: a FIFO hangs nothing), owned by this
// user or root, writable by no one else, in a directory no one else can write (or a sticky one,
// as /tmp, where others cannot replace a file of this user), of at most kMaxModuleBytes, and a
// zip archive whose records do not expand past the file's size (PyTorch stores them
// uncompressed: a 1 MB zip bomb is refused before LibTorch inflates it). No LibTorch here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace trainctl::checkpoint {

constexpr int64_t kMaxModuleBytes = int64_t{4} << 30;

struct ModuleFile {
  std::string path;    // as named
  std::string bytes;   // the whole file
  std::string sha256;  // of `bytes`, hex
};

// kInvalidArgument names the file and what is wrong (a FIFO, too large, not a zip archive, a zip
// bomb); kPermissionDenied who else could have written it; kNotFound when it cannot be opened.
Result<ModuleFile> ReadModuleFile(const std::string& path);

// What ReadModuleFile checks of the bytes: a zip archive whose central directory says its records
// inflate to at most about twice the file's size (a zip bomb refused), stored or deflated.
Status CheckModuleArchive(std::string_view bytes, const std::string& path);

// The name of a run's copy of its module, in its output directory (and checkpoint directory):
// what a checkpoint's metadata "torchscript" names, with the copy's sha256 in
// "torchscript_sha256".
constexpr const char* kModuleCopyName = "model.pt";

}  // namespace trainctl::checkpoint
