// A region's memory as a file: a sealed memfd made by one process and mapped by the other
// (the layout is shm/region.h). The shim's connections (shm.h) and the NCCL face's message
// comms (shm/msg.h) both share their rings this way.
//
// The process that maps a region another made does not trust it: the file must be sealed
// against shrinking (a truncation under our mapping would turn our next access into a
// SIGBUS) and hold exactly the region's size, and the header is read once, right after
// mapping, and must say what the message that came with the file said.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slip::shm {

// Makes a sealed memfd of RegionSize(ring_size) bytes at or above `fd_floor`, maps it and
// writes the header (magic, ring size, nonce). 0, or -errno (-EFBIG: the file size limit
// would not allow it); on failure nothing is left open or mapped.
int CreateRegion(uint32_t ring_size, uint64_t nonce, int fd_floor, int* memfd,
                 void** base) noexcept;

// Maps a region another process made and handed over as `memfd` (the caller keeps the
// descriptor), after checking the file and the header against `ring_size` and `nonce`.
// nullptr with *error: -EINVAL (not such a region) or -ENOMEM (no room to map it).
void* MapPeerRegion(int memfd, uint32_t ring_size, uint64_t nonce, int* error) noexcept;

}  // namespace slip::shm
