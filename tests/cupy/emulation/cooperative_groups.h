// The emulator's stand-in for CUDA's <cooperative_groups.h> (found first through -I):
// only what generated kernels use, this_grid().sync(), a grid-wide barrier that
// cuda_emu.h implements for cooperative launches (vy_emu::launch_cooperative).
#pragma once

#include "cuda_emu.h"

namespace cooperative_groups {
struct grid_group {
  void sync() const { vy_emu::grid_sync(); }
};
inline grid_group this_grid() { return grid_group{}; }
}  // namespace cooperative_groups
