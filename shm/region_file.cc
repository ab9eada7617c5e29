#include "shm/region_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <new>

#include "core/sys.h"
#include "shm/region.h"

namespace slip::shm {

namespace {

bool IsSealedFileOfSize(int memfd, uint64_t size) noexcept {
  struct stat st;
  constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;
  const int seals = sys::fcntl(memfd, F_GET_SEALS);
  return seals >= 0 && (seals & kSizeSeals) == kSizeSeals && fstat(memfd, &st) == 0 &&
         S_ISREG(st.st_mode) && uint64_t(st.st_size) == size;
}

}  // namespace

int CreateRegion(uint32_t ring_size, uint64_t nonce, int fd_floor, int* memfd,
                 void** base) noexcept {
  *memfd = -1;
  *base = nullptr;
  const size_t size = RegionSize(ring_size);
  // A memfd counts against RLIMIT_FSIZE: growing it past the limit would raise SIGXFSZ,
  // which kills the host program.
  if (!sys::FileSizeAllows(size)) return -EFBIG;
  const int fd =
      sys::MoveAbove(memfd_create("slipstream", MFD_CLOEXEC | MFD_ALLOW_SEALING), fd_floor);
  if (fd < 0) return -errno;
  int rc = 0;
  void* region = MAP_FAILED;
  if (sys::TruncateFitting(fd, size) != 0 ||
      sys::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      (region = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    rc = -errno;
    sys::close(fd);
    return rc;
  }
  auto* control = new (region) RegionControl();
  control->header.magic = kRegionMagic;
  control->header.ring_size = ring_size;
  control->header.nonce = nonce;
  *memfd = fd;
  *base = region;
  return 0;
}

void* MapPeerRegion(int memfd, uint32_t ring_size, uint64_t nonce, int* error) noexcept {
  *error = -EINVAL;
  if (!ValidRingSize(ring_size) || !IsSealedFileOfSize(memfd, RegionSize(ring_size)))
    return nullptr;
  const size_t size = RegionSize(ring_size);
  void* region = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (region == MAP_FAILED) {
    *error = -ENOMEM;
    return nullptr;
  }
  // The one read of the header: the values that count are the caller's.
  const RegionHeader& header = static_cast<RegionControl*>(region)->header;
  const uint32_t magic = header.magic;
  const uint32_t header_ring = header.ring_size;
  const uint64_t header_nonce = header.nonce;
  if (magic != kRegionMagic || header_ring != ring_size || header_nonce != nonce) {
    munmap(region, size);
    return nullptr;
  }
  *error = 0;
  return region;
}

}  // namespace slip::shm
