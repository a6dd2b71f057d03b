#include "data/sampler.h"

#include <numeric>
#include <random>

namespace trainctl::data {

int64_t ShardSize(int64_t n, const SamplerOptions& o) {
  if (o.drop_last) return n / o.world_size;
  return (n + o.world_size - 1) / o.world_size;
}

std::vector<int64_t> ShardIndices(int64_t n, int64_t epoch, const SamplerOptions& o) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (o.shuffle) {
    // Fisher-Yates with a fixed generator: the same permutation on every rank and platform
    // (std::shuffle's algorithm is left to the standard library).
    std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) {
      uint64_t bound = static_cast<uint64_t>(i) + 1;
      uint64_t limit = UINT64_MAX - UINT64_MAX % bound;  // reject to stay unbiased
      uint64_t r;
      do r = rng(); while (r >= limit);
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(r % bound)]);
    }
  }
  int64_t per_rank = ShardSize(n, o);
  int64_t total = per_rank * o.world_size;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  for (int64_t k = o.rank; k < total; k += o.world_size) {
    mine.push_back(order[static_cast<size_t>(k % n)]);  // k >= n only when padding
  }
  return mine;
}

}  // namespace trainctl::data
