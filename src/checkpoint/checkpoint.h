// Checkpoints as safetensors files: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the raw bytes. The header's "__metadata__"
// holds the step, the caller's metadata, and "trainctl.crc32" of the data section, so a
// checkpoint is self-checking and any safetensors reader (Python's safetensors, numpy by hand)
// loads it. No torch here: the trainer turns tensors into blobs and back.
//
// CheckpointDir keeps ckpt-<step>.safetensors files in one directory (shared storage on a
// cluster): Save() writes atomically (temporary file, fsync, rename, fsync of the directory) and
// keeps the newest `keep_last`; LoadLatest() returns the newest file that passes its checks,
// falling back past corrupt or truncated ones.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl::checkpoint {

struct Blob {
  std::string name;
  std::string dtype;  // safetensors dtype: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL
  std::vector<int64_t> shape;
  std::string data;  // little-endian, row-major; size = product(shape) * dtype size
};

struct Checkpoint {
  int64_t step = 0;
  std::map<std::string, std::string> metadata;
  std::vector<Blob> tensors;
  const Blob* Find(const std::string& name) const;
  // The metadata value under `key`, or "" when there is none.
  std::string Meta(const std::string& key) const;
};

// Bytes per element of a safetensors dtype, or 0 if unknown.
int DtypeSize(const std::string& dtype);

// kInvalidArgument when a blob's size does not match its dtype and shape, or names repeat.
Result<std::string> Encode(const Checkpoint& checkpoint);
// Validates everything (header, offsets, sizes, checksum); `source` names the bytes in errors.
Result<Checkpoint> Decode(const std::string& bytes, const std::string& source);

// Reads and decodes the file at `path`, checking the header first: its length, then the data
// size its tensors declare against the file's size, before reading (or allocating for) the rest.
// Not a regular file (a device, a FIFO), or no memory for it: an error naming the file.
Result<Checkpoint> ReadCheckpointFile(const std::string& path);

class CheckpointDir {
 public:
  // Files are written with `file_mode` (0600 for what only this user may read).
  CheckpointDir(std::string dir, int keep_last, int file_mode = 0644)
      : dir_(std::move(dir)), keep_last_(keep_last), file_mode_(file_mode) {}

  // Writes ckpt-<step>.safetensors atomically, then removes all but the newest keep_last.
  Status Save(const Checkpoint& checkpoint);
  // The newest checkpoint that decodes and passes its checksum. Each file skipped on the way is
  // added to `skipped` as "path: why". kNotFound when there is none.
  Result<Checkpoint> LoadLatest(std::vector<std::string>* skipped = nullptr) const;
  // Checkpoint files, oldest first.
  std::vector<std::string> List() const;
  std::string PathFor(int64_t step) const;

 private:
  std::string dir_;
  int keep_last_;
  int file_mode_;
};

}  // namespace trainctl::checkpoint
