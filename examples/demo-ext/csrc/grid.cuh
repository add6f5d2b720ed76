#pragma once

#include <cstdint>

namespace demo {

constexpr int kThreads = 256;

// Grid-stride loops keep the grid small for any n, so one launch shape serves every size.
inline unsigned int blocks_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 1024 ? (blocks < 1 ? 1 : blocks) : 1024);
}

}  // namespace demo
