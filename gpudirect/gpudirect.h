// GPUDirect: what the CUDA driver says about memory, for the NCCL face.
//
// The driver API is loaded at run time (dlopen of libcuda.so.1), never linked: the plugin
// loads and works on a host without a GPU or a driver, and says why it offers host memory
// only. Nothing here allocates GPU memory or changes the CUDA context of the caller.
//
// Thread safety: every function may be called from any thread; the driver is loaded once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slip::gpudirect {

enum class MemoryKind : uint8_t {
  kHost,        // memory CUDA does not know (pageable host memory)
  kPinnedHost,  // host memory registered with or allocated by CUDA
  kDevice,      // device memory
  kManaged,     // unified memory
};
const char* KindName(MemoryKind kind) noexcept;

struct DriverInfo {
  bool loaded = false;  // libcuda.so.1 found and cuInit succeeded
  int devices = 0;      // CUDA devices visible
  int version = 0;      // cuDriverGetVersion
  bool dmabuf =
      false;  // every device supports DMA-BUF export (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
  char why[160] = {};  // when not loaded or no device: why, for the log
};

// Loads and initialises the driver on the first call; the same answer afterwards.
const DriverInfo& Driver() noexcept;

// What kind of memory `p` is. kHost when there is no driver.
MemoryKind Classify(const void* p) noexcept;

// A DMA-BUF descriptor (the caller's to close) for device memory [p, p + size), with
// *offset where p lies in it, or -1 (no driver, no DMA-BUF support, not device memory).
int DmaBufOf(const void* p, size_t size, uint64_t* offset) noexcept;

}  // namespace slip::gpudirect
