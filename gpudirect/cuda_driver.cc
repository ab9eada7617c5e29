// The CUDA driver API, looked up at run time (gpudirect.h). Only the few entry points we
// use are declared, with the types of the driver's documented ABI (cuda.h), so that the
// build needs no CUDA headers either.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>

#include "gpudirect/gpudirect.h"

namespace slip::gpudirect {

namespace {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
constexpr CUresult kCudaSuccess = 0;
constexpr int kPointerAttributeMemoryType = 2;        // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttributeIsManaged = 8;         // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr unsigned kMemoryTypeHost = 1;               // CU_MEMORYTYPE_HOST
constexpr unsigned kMemoryTypeDevice = 2;             // CU_MEMORYTYPE_DEVICE
constexpr unsigned kMemoryTypeUnified = 4;            // CU_MEMORYTYPE_UNIFIED
constexpr int kDeviceAttributeDmaBufSupported = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED

struct Api {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*driver_get_version)(int*) = nullptr;
  CUresult (*device_get_count)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_attribute)(int*, int, CUdevice) = nullptr;
  CUresult (*pointer_get_attribute)(void*, int, CUdeviceptr) = nullptr;
  // CUDA 11.7 on: absent from older drivers, and then nothing is exported as a DMA-BUF.
  CUresult (*mem_get_handle_for_address_range)(void*, CUdeviceptr, size_t, int,
                                               unsigned long long) = nullptr;
};
constexpr int kRangeHandleDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

Api g_api;
DriverInfo g_info;
std::once_flag g_once;

template <typename F>
bool Find(void* lib, const char* name, F* out) noexcept {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

void Load() noexcept {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    snprintf(g_info.why, sizeof(g_info.why), "no CUDA driver (libcuda.so.1 not found)");
    return;
  }
  Api api;
  if (!Find(lib, "cuInit", &api.init) ||
      !Find(lib, "cuDriverGetVersion", &api.driver_get_version) ||
      !Find(lib, "cuDeviceGetCount", &api.device_get_count) ||
      !Find(lib, "cuDeviceGet", &api.device_get) ||
      !Find(lib, "cuDeviceGetAttribute", &api.device_get_attribute) ||
      !Find(lib, "cuPointerGetAttribute", &api.pointer_get_attribute)) {
    snprintf(g_info.why, sizeof(g_info.why), "libcuda.so.1 lacks the driver API we use");
    dlclose(lib);
    return;
  }
  Find(lib, "cuMemGetHandleForAddressRange", &api.mem_get_handle_for_address_range);
  if (CUresult rc = api.init(0); rc != kCudaSuccess) {
    snprintf(g_info.why, sizeof(g_info.why), "cuInit failed (CUresult %d): no usable GPU", rc);
    return;  // (the library stays loaded: unloading a driver that started is not safe)
  }
  api.driver_get_version(&g_info.version);
  if (api.device_get_count(&g_info.devices) != kCudaSuccess || g_info.devices == 0) {
    snprintf(g_info.why, sizeof(g_info.why), "the CUDA driver sees no device");
    g_info.devices = 0;
  }
  bool dmabuf = g_info.devices > 0;
  for (int i = 0; i < g_info.devices; ++i) {
    CUdevice dev;
    int supported = 0;
    if (api.device_get(&dev, i) != kCudaSuccess ||
        api.device_get_attribute(&supported, kDeviceAttributeDmaBufSupported, dev) !=
            kCudaSuccess ||
        !supported)
      dmabuf = false;
  }
  g_info.dmabuf = dmabuf && api.mem_get_handle_for_address_range != nullptr;
  g_api = api;
  g_info.loaded = true;
}

}  // namespace

const char* KindName(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kPinnedHost:
      return "pinned host";
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kManaged:
      return "managed";
  }
  return "?";
}

const DriverInfo& Driver() noexcept {
  std::call_once(g_once, Load);
  return g_info;
}

MemoryKind Classify(const void* p) noexcept {
  if (!Driver().loaded) return MemoryKind::kHost;
  unsigned type = 0;
  const auto addr = CUdeviceptr(reinterpret_cast<uintptr_t>(p));
  // (An error means CUDA does not know the address: ordinary pageable memory.)
  if (g_api.pointer_get_attribute(&type, kPointerAttributeMemoryType, addr) != kCudaSuccess)
    return MemoryKind::kHost;
  unsigned managed = 0;
  if (g_api.pointer_get_attribute(&managed, kPointerAttributeIsManaged, addr) == kCudaSuccess &&
      managed)
    return MemoryKind::kManaged;
  if (type == kMemoryTypeDevice) return MemoryKind::kDevice;
  if (type == kMemoryTypeUnified) return MemoryKind::kManaged;
  if (type == kMemoryTypeHost) return MemoryKind::kPinnedHost;
  return MemoryKind::kHost;
}

int DmaBufOf(const void* p, size_t size, uint64_t* offset) noexcept {
  if (!Driver().dmabuf || size == 0) return -1;
  // The range handed to the driver is whole host pages; the buffer is `offset` into it.
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = uintptr_t(p) & ~(page - 1);
  const uintptr_t end = (uintptr_t(p) + size + page - 1) & ~(page - 1);
  int fd = -1;
  if (g_api.mem_get_handle_for_address_range(&fd, CUdeviceptr(begin), size_t(end - begin),
                                             kRangeHandleDmaBufFd, 0) != kCudaSuccess)
    return -1;
  *offset = uint64_t(uintptr_t(p) - begin);
  return fd;
}

}  // namespace slip::gpudirect
