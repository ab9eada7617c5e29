// gpudirect on a real GPU: the driver found and initialised, and pointers classified as
// CUDA allocated them (device, pinned host, managed) or not at all (pageable host).
// Allocates through the driver API it looks up the same way gpudirect does, so it needs no
// CUDA to build. Exit status: 0 all right, 1 a wrong answer, 77 no GPU (skipped).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gpudirect/gpudirect.h"

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;

int failures = 0;

void Expect(slip::gpudirect::MemoryKind got, slip::gpudirect::MemoryKind want, const char* what) {
  const bool ok = got == want;
  printf("%s %s: %s (want %s)\n", ok ? "ok  " : "FAIL", what, slip::gpudirect::KindName(got),
         slip::gpudirect::KindName(want));
  failures += !ok;
}

}  // namespace

int main() {
  using slip::gpudirect::MemoryKind;
  const slip::gpudirect::DriverInfo& info = slip::gpudirect::Driver();
  if (!info.loaded || info.devices == 0) {
    printf("SKIP: %s\n", info.why);
    return 77;
  }
  printf("driver %d, %d device(s), DMA-BUF %s\n", info.version, info.devices,
         info.dmabuf ? "supported" : "not supported");
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto device_primary_ctx_retain =
      reinterpret_cast<CUresult (*)(CUcontext*, int)>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
  auto ctx_set_current = reinterpret_cast<CUresult (*)(CUcontext)>(dlsym(lib, "cuCtxSetCurrent"));
  auto mem_alloc =
      reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(dlsym(lib, "cuMemAlloc_v2"));
  auto mem_alloc_host =
      reinterpret_cast<CUresult (*)(void**, size_t)>(dlsym(lib, "cuMemAllocHost_v2"));
  auto mem_alloc_managed = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t, unsigned)>(
      dlsym(lib, "cuMemAllocManaged"));
  if (!device_primary_ctx_retain || !ctx_set_current || !mem_alloc || !mem_alloc_host ||
      !mem_alloc_managed) {
    printf("FAIL: the driver lacks the allocation calls\n");
    return 1;
  }
  CUcontext ctx = nullptr;
  if (device_primary_ctx_retain(&ctx, 0) != 0 || ctx_set_current(ctx) != 0) {
    printf("FAIL: no context on device 0\n");
    return 1;
  }
  CUdeviceptr device = 0, managed = 0;
  void* pinned = nullptr;
  if (mem_alloc(&device, 1 << 20) != 0 || mem_alloc_host(&pinned, 1 << 20) != 0 ||
      mem_alloc_managed(&managed, 1 << 20, 1 /* CU_MEM_ATTACH_GLOBAL */) != 0) {
    printf("FAIL: allocations\n");
    return 1;
  }
  std::vector<char> pageable(1 << 20);
  Expect(slip::gpudirect::Classify(reinterpret_cast<void*>(device)), MemoryKind::kDevice,
         "cuMemAlloc");
  Expect(slip::gpudirect::Classify(reinterpret_cast<void*>(device + 4096)), MemoryKind::kDevice,
         "inside cuMemAlloc");
  Expect(slip::gpudirect::Classify(pinned), MemoryKind::kPinnedHost, "cuMemAllocHost");
  Expect(slip::gpudirect::Classify(reinterpret_cast<void*>(managed)), MemoryKind::kManaged,
         "cuMemAllocManaged");
  Expect(slip::gpudirect::Classify(pageable.data()), MemoryKind::kHost, "malloc");
  // What the NCCL face registers GPU memory by where the NIC takes DMA-BUF.
  if (slip::gpudirect::Driver().dmabuf) {
    uint64_t offset = 1;
    const int fd = slip::gpudirect::DmaBufOf(reinterpret_cast<void*>(device + 100), 4096, &offset);
    printf("%s: DMA-BUF of cuMemAlloc + 100: fd %d, offset %llu\n",
           fd >= 0 && offset == 100 ? "ok" : "FAIL", fd, (unsigned long long)offset);
    failures += fd >= 0 && offset == 100 ? 0 : 1;
    if (fd >= 0) close(fd);
    Expect(slip::gpudirect::DmaBufOf(pageable.data(), 4096, &offset) < 0 ? MemoryKind::kHost
                                                                         : MemoryKind::kDevice,
           MemoryKind::kHost, "no DMA-BUF of malloc memory");
  }
  return failures ? 1 : 0;
}
