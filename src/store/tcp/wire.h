// The TCP store's wire format. Every message is a frame: u32 length (little endian), then the
// body. A request body is an Op byte and its fields; a reply body is a Reply byte and its fields.
// Strings are u32 length + bytes; integers are i64 little endian; timeouts are i64 milliseconds.
// The first request on a connection must be kHello with the job's token. A client may send several
// requests before reading any reply (MultiSet, TryGetMany): the server runs them in order and
// answers each in that order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace trainctl::wire {

inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
// Before a connection has presented the token, nothing larger than a hello is buffered.
inline constexpr uint32_t kMaxHelloBytes = 4096;
inline constexpr uint32_t kProtocolVersion = 1;

enum class Op : uint8_t {
  kHello = 1,   // version, token
  kSet,         // key, value
  kGet,         // key, timeout_ms          -> value | kTimeout
  kTryGet,      // key                      -> value | kNotFound
  kAdd,         // key, delta               -> i64
  kCompareSet,  // key, expected, desired   -> value
  kWait,        // n, keys..., timeout_ms   -> ok | kTimeout
  kDelete,      // key                      -> i64 (1 if it existed)
};

enum class Reply : uint8_t { kOk = 0, kNotFound, kTimeout, kError, kUnauthorized };

class Writer {
 public:
  Writer& U8(uint8_t v);
  Writer& I64(int64_t v);
  Writer& Str(std::string_view s);
  // The body with its length prefix.
  std::string Frame() const;

 private:
  std::string body_;
};

class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}
  bool U8(uint8_t* v);
  bool I64(int64_t* v);
  bool Str(std::string* s);
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

// The body length that a frame starting at `buf` announces; `buf` holds at least its 4 bytes.
uint32_t FrameLength(std::string_view buf);
// Cuts one frame off the front of `buf`. Returns 1 and fills `body` when a whole frame is there,
// 0 when more bytes are needed, -1 when the announced length is over `max`.
int TakeFrame(std::string* buf, std::string* body, uint32_t max = kMaxFrameBytes);

}  // namespace trainctl::wire
