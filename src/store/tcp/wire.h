// The TCP store's wire: frames of common/wire.h. A request's kind is an Op and its fields follow;
// a reply's kind is a Reply. Timeouts are i64 milliseconds. The first request on a connection
// must be kHello with the protocol version and the job's token. A client may send several
// requests before reading any reply (MultiSet, TryGetMany): the server runs them in order and
// answers each in that order.
#pragma once

#include <cstdint>

#include "common/wire.h"

namespace trainctl::wire {

inline constexpr uint64_t kMaxFrameBytes = 64u << 20;
// 2: the framing shared with the parameter servers (kind, u64 length); 1 had a u32 length first.
// 3: kWaitAny.
inline constexpr uint32_t kProtocolVersion = 3;

enum class Op : uint8_t {
  kHello = 1,   // version, token
  kSet,         // key, value
  kGet,         // key, timeout_ms          -> value | kTimeout
  kTryGet,      // key                      -> value | kNotFound
  kAdd,         // key, delta               -> i64
  kCompareSet,  // key, expected, desired   -> value
  kWait,        // n, keys..., timeout_ms   -> ok | kTimeout
  kDelete,      // key                      -> i64 (1 if it existed)
  kWaitAny,     // n, keys..., timeout_ms   -> i64 index, value (the first key that exists) | kTimeout
};

enum class Reply : uint8_t { kOk = 0, kNotFound, kTimeout, kError, kUnauthorized };

}  // namespace trainctl::wire
