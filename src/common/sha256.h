// SHA-256 (FIPS 180-4), for recognising a file by its contents: a model file a checkpoint was
// trained with (checkpoint/module_file.h). Not a MAC: it says which bytes, not who wrote them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace trainctl {

class Sha256 {
 public:
  Sha256();
  // Adds bytes; any number of calls, of any sizes.
  void Update(const void* data, size_t size);
  void Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // The digest as 64 lowercase hex digits (as sha256sum prints it). Call once.
  std::string HexDigest();

 private:
  void Block(const uint8_t* block);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

// The hex digest of `bytes`.
std::string Sha256Hex(std::string_view bytes);

}  // namespace trainctl
