#include "comm/communicator.h"

namespace trainctl::comm {

Status CheckGroup(const char* backend, int rank, int size) {
  if (size >= 1 && rank >= 0 && rank < size) return Status::Ok();
  return InvalidArgument(std::string(backend) + ": rank " + std::to_string(rank) +
                         " out of range for size " + std::to_string(size));
}

}  // namespace trainctl::comm
