// DistributedSampler: which items each rank reads in an epoch. All ranks share a seed, so they
// agree on one permutation per epoch without talking; rank r takes items r, r+W, r+2W, ... of it.
// Every rank gets the same number of items (the permutation is padded by wrapping around, as
// PyTorch's DistributedSampler does, or cut with drop_last), so no rank waits in a collective.
#pragma once

#include <cstdint>
#include <vector>

namespace trainctl::data {

struct SamplerOptions {
  int rank = 0;
  int world_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;  // true: drop the tail instead of padding
};

// Items per rank in an epoch of `n` items.
int64_t ShardSize(int64_t n, const SamplerOptions& options);
// This rank's item indices for `epoch`, in the order to read them.
std::vector<int64_t> ShardIndices(int64_t n, int64_t epoch, const SamplerOptions& options);

}  // namespace trainctl::data
