#include "core/own_fds.h"

#include <link.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <new>

namespace slip {

namespace {

constexpr unsigned kPageBits = 10;
constexpr unsigned kPageSize = 1u << kPageBits;
// Descriptors up to 4 Mi (far past any RLIMIT_NOFILE a distribution sets; numbers beyond
// are never marked, and so stay the kernel's to answer for).
constexpr unsigned kPages = 4096;

struct Entry {
  // st_dev + 1 (0: not marked), then st_ino: written ino first, dev last (release).
  std::atomic<uint64_t> dev{0};
  std::atomic<uint64_t> ino{0};
};

struct Page {
  Entry entries[kPageSize];
};

}  // namespace

struct OwnFdTable {
  std::atomic<Page*> pages[kPages] = {};
  std::atomic<int> top_page{-1};  // the highest page ever allocated
};

namespace {

std::atomic<OwnFdTable*> g_table{nullptr};

bool Identity(int fd, uint64_t* dev, uint64_t* ino) noexcept {
  struct stat st;
  if (::syscall(SYS_fstat, fd, &st) != 0) return false;
  *dev = uint64_t(st.st_dev) + 1;
  *ino = uint64_t(st.st_ino);
  return true;
}

// The entry of `fd`, allocating its page when `make`; nullptr when there is none.
Entry* EntryOf(int fd, bool make) noexcept {
  OwnFdTable* t = g_table.load(std::memory_order_acquire);
  if (!t || fd < 0 || unsigned(fd) >= kPages * kPageSize) return nullptr;
  const unsigned index = unsigned(fd) >> kPageBits;
  Page* page = t->pages[index].load(std::memory_order_acquire);
  if (!page && make) {
    Page* fresh = new (std::nothrow) Page;
    if (!fresh) return nullptr;
    if (t->pages[index].compare_exchange_strong(page, fresh, std::memory_order_acq_rel)) {
      page = fresh;
      int top = t->top_page.load(std::memory_order_relaxed);
      while (top < int(index) &&
             !t->top_page.compare_exchange_weak(top, int(index), std::memory_order_release)) {
      }
    } else {
      delete fresh;  // another thread's page is in place (`page` holds it)
    }
  }
  return page ? &page->entries[unsigned(fd) & (kPageSize - 1)] : nullptr;
}

}  // namespace

OwnFdTable* EnableOwnFds() noexcept {
  static OwnFdTable table;  // (trivially destructible pages pointers: never torn down)
  g_table.store(&table, std::memory_order_release);
  return &table;
}

void UseOwnFds(OwnFdTable* table) noexcept {
  g_table.store(table, std::memory_order_release);
}

OwnFdTable* OwnFds() noexcept {
  return g_table.load(std::memory_order_acquire);
}

void MarkOwnFd(int fd) noexcept {
  Entry* e = EntryOf(fd, true);
  uint64_t dev, ino;
  if (!e || !Identity(fd, &dev, &ino)) return;
  e->dev.store(0, std::memory_order_relaxed);
  e->ino.store(ino, std::memory_order_relaxed);
  e->dev.store(dev, std::memory_order_release);
}

void RemarkOwnFd(int fd) noexcept {
  Entry* e = EntryOf(fd, false);
  if (e && e->dev.load(std::memory_order_relaxed) != 0) MarkOwnFd(fd);
}

void ForgetOwnFd(int fd) noexcept {
  // (Every close asks: a number that carries no mark costs loads, never a store.)
  Entry* e = EntryOf(fd, false);
  if (e && e->dev.load(std::memory_order_relaxed) != 0) e->dev.store(0, std::memory_order_release);
}

bool IsOwnFd(int fd) noexcept {
  Entry* e = EntryOf(fd, false);
  if (!e) return false;
  const uint64_t dev = e->dev.load(std::memory_order_acquire);
  if (dev == 0) return false;
  const uint64_t ino = e->ino.load(std::memory_order_relaxed);
  uint64_t now_dev, now_ino;
  if (Identity(fd, &now_dev, &now_ino) && now_dev == dev && now_ino == ino) return true;
  // Stale: the number was closed under us, or now holds the program's own file.
  uint64_t expected = dev;
  e->dev.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
  return false;
}

bool OwnFdMarked(int fd) noexcept {
  const Entry* e = EntryOf(fd, false);
  return e && e->dev.load(std::memory_order_acquire) != 0;
}

bool AnyOwnFds() noexcept {
  OwnFdTable* t = g_table.load(std::memory_order_acquire);
  return t && t->top_page.load(std::memory_order_acquire) >= 0;
}

int NextMarkedFd(unsigned from, unsigned last) noexcept {
  OwnFdTable* t = g_table.load(std::memory_order_acquire);
  if (!t) return -1;
  const int top = t->top_page.load(std::memory_order_acquire);
  for (unsigned fd = from; fd <= last && top >= 0 && (fd >> kPageBits) <= unsigned(top);) {
    const Page* page = t->pages[fd >> kPageBits].load(std::memory_order_acquire);
    if (!page) {
      fd = ((fd >> kPageBits) + 1) << kPageBits;  // (the next page's first number)
      continue;
    }
    if (page->entries[fd & (kPageSize - 1)].dev.load(std::memory_order_acquire) != 0)
      return int(fd);
    if (fd == last) break;
    ++fd;
  }
  return -1;
}

namespace {

struct CodeRange {
  uintptr_t lo = 0, hi = 0;
};
constexpr int kCodeRanges = 8;
CodeRange g_code[kCodeRanges];
std::atomic<int> g_code_count{0};

struct FindObject {
  uintptr_t anchor;
  CodeRange found;
};

int MatchObject(dl_phdr_info* info, size_t, void* data) noexcept {
  auto* f = static_cast<FindObject*>(data);
  bool inside = false;
  CodeRange code{UINTPTR_MAX, 0};
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    const uintptr_t hi = lo + ph.p_memsz;
    if (f->anchor >= lo && f->anchor < hi) inside = true;
    if (ph.p_flags & PF_X) {
      if (lo < code.lo) code.lo = lo;
      if (hi > code.hi) code.hi = hi;
    }
  }
  if (!inside || code.hi == 0) return 0;
  f->found = code;
  return 1;
}

}  // namespace

void NoteOwnCode(const void* anchor) noexcept {
  FindObject f{uintptr_t(anchor), {}};
  if (dl_iterate_phdr(MatchObject, &f) == 0) return;
  // (Recorded under no lock: callers are the shim's start-up and the module loader, which
  // loads each module once under its own once-flag; a lost race only leaves a module's
  // code unrecorded, whose calls are then the program's to answer.)
  const int n = g_code_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (g_code[i].lo == f.found.lo) return;
  if (n >= kCodeRanges) return;
  g_code[n] = f.found;
  g_code_count.store(n + 1, std::memory_order_release);
}

bool IsOwnCode(const void* pc) noexcept {
  const int n = g_code_count.load(std::memory_order_acquire);
  const auto at = uintptr_t(pc);
  for (int i = 0; i < n; ++i)
    if (at >= g_code[i].lo && at < g_code[i].hi) return true;
  return false;
}

}  // namespace slip
