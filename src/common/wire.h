// The framed transport of trainctl's own wires, the TCP store's (store/tcp/wire.h) and the
// parameter servers' (comm/ps/ps.h): every message is a frame, its kind (u8: an op or a reply),
// the length of the rest (u64 little endian), then the rest, the kind's fields: integers i64
// little endian, strings u32 length + bytes, float arrays raw (their count known to the reader).
// The first message on a connection is a hello that carries the job's token, at most
// kMaxHelloBytes: nothing larger is read before the token is checked, in constant time
// (ConstantTimeEquals, common/strings.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace trainctl::wire {

inline constexpr size_t kFrameHeaderBytes = 9;    // kind, length
inline constexpr uint64_t kMaxHelloBytes = 4096;  // a hello's frame, header included

// A frame's body: its kind first (U8), then its fields.
class Writer {
 public:
  Writer& U8(uint8_t v);
  Writer& I64(int64_t v);
  Writer& Str(std::string_view s);
  Writer& Raw(const void* p, size_t n);
  Writer& Floats(const float* p, int64_t n) { return Raw(p, n * sizeof(float)); }
  // The frame: the kind (the body's first byte), the length of the rest, the rest.
  std::string Frame() const;

 private:
  std::string body_;
};

// Reads a frame's fields (a body, or what follows its kind).
class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}
  bool U8(uint8_t* v);
  bool I64(int64_t* v);
  bool Str(std::string* s);
  bool Floats(float* out, int64_t n);
  // A view of the next n floats, without copying; null when fewer are left.
  const float* FloatView(int64_t n);
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

// A frame's header for `kind` and `rest` bytes after it, for senders that write the rest from
// where it lies (the parameter servers' gradients and parameters).
std::string FrameHeader(uint8_t kind, uint64_t rest);
// The kind and the length of the rest that the header at the start of `buf` announces; `buf`
// holds at least kFrameHeaderBytes.
uint8_t FrameKind(std::string_view buf);
uint64_t FrameRest(std::string_view buf);
// Cuts one frame off the front of `buf` into `body` (its kind, then the rest). Returns 1 when a
// whole frame was there, 0 when more bytes are needed, -1 when the frame (header included) would
// be over `max` bytes.
int TakeFrame(std::string* buf, std::string* body, uint64_t max);

}  // namespace trainctl::wire
