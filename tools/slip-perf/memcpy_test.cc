// memcpy: copies one N-byte buffer into another, over and over, in one thread. For a
// buffer the size of a shared-memory ring this is the rate a single copy can reach, the
// physical limit of a transport that copies each byte into the ring and out again.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "tools/slip-perf/budget.h"
#include "tools/slip-perf/commands.h"
#include "tools/slip-perf/sweep.h"

namespace slipperf {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], FreeDeleter>;

Buffer AllocateTouched(size_t size, int fill) {
  constexpr size_t kAlign = 64;
  Buffer b(
      static_cast<uint8_t*>(std::aligned_alloc(kAlign, (size + kAlign - 1) / kAlign * kAlign)));
  if (!b) throw std::bad_alloc();
  std::memset(b.get(), fill, size);
  return b;
}

// Keeps the compiler from dropping copies whose result is never read.
inline void Clobber(void* p) {
  asm volatile("" : : "r"(p) : "memory");
}

}  // namespace

int RunMemcpy(const MemcpyOptions& options) {
  const size_t size = options.size;
  const Buffer src = AllocateTouched(size, 0x5a);
  const Buffer dst = AllocateTouched(size, 0);
  // Copies between clock reads: about 1 MiB of copying per batch, at least one copy.
  const uint64_t batch = options.budget.iters != 0 ? 1 : std::max<uint64_t>(1, (1u << 20) / size);
  auto copy_batch = [&](Phase& phase) {
    for (uint64_t i = 0; i < batch; ++i) {
      std::memcpy(dst.get(), src.get(), size);
      Clobber(dst.get());
    }
    phase.Tick(batch);
  };

  for (Phase warmup(WarmupOf(options.budget)); !warmup.Done();) copy_batch(warmup);
  Phase measure(options.budget);
  while (!measure.Done()) copy_batch(measure);
  const uint64_t end = NowNs();

  Result r;
  r.test = "memcpy";
  r.size = size;
  r.iters = measure.count();
  r.bytes = measure.count() * size;
  r.seconds = static_cast<double>(end - measure.start_ns()) * 1e-9;
  r.bytes_per_s = static_cast<double>(r.bytes) / r.seconds;
  WriteReport(stdout, options.output.format, options.output.meta, {CombineRepeats({r})});
  return 0;
}

}  // namespace slipperf
