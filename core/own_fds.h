// The descriptors Slipstream holds in the application's process: TCP anchors, the far ends
// of proxies, rendezvous and notification sockets, event queues, the log and stats files,
// the descriptors a transport library makes (docs/DESIGN.md, "Descriptors the program did
// not open"). The program never opened them, so its own calls must find them as the kernel
// finds a number that is not open: close() answers EBADF and closes nothing, close_range()
// and closefrom() step over them, and no number of ours is handed back to the program
// for its own files.
//
// One table per process, indexed by descriptor number. An entry records what the number
// referred to when it was marked (device and inode, from fstat), so a mark that outlived
// its descriptor (one closed by a path that did not forget it, a raw system call of the
// program's) is recognised as stale by the first question asked about it, and cleared:
// a number of ours is never taken for the program's, nor the program's for ours.
//
// The shim enables the table (EnableOwnFds) at start-up. A transport module carries its
// own copy of core; the face hands it the shim's table at load (UseOwnFds), so that what
// the module's code marks is what the shim's interposed calls see. Where no table is
// enabled (the NCCL face, the tools) marking costs one atomic load and does nothing.
//
// Thread safety: every function may be called from any thread; an entry is written with
// release and read with acquire stores. No allocation on a data path: a page of entries
// (1,024 descriptors) is allocated the first time a descriptor in it is marked.
#pragma once

namespace slip {

struct OwnFdTable;

// The shim's: enables the process's table (static storage) and returns it.
OwnFdTable* EnableOwnFds() noexcept;
// A module's: marks go to `table` (the face's, or nullptr: none).
void UseOwnFds(OwnFdTable* table) noexcept;
// The table in use, or nullptr.
OwnFdTable* OwnFds() noexcept;

// Records `fd` as ours (what it refers to now). Silently nothing when no table is enabled,
// when `fd` cannot be examined, or when no memory is left for its page.
void MarkOwnFd(int fd) noexcept;
// `fd`, ours, now refers to something else (dup3 onto it): its mark follows.
void RemarkOwnFd(int fd) noexcept;
// `fd` is about to be closed by us.
void ForgetOwnFd(int fd) noexcept;
// Whether `fd` is one of ours: marked, and still referring to what it was marked for.
// (One system call when it is marked; two atomic loads when it is not.)
bool IsOwnFd(int fd) noexcept;
// Whether `fd` carries a mark, stale or not (two atomic loads, no system call).
bool OwnFdMarked(int fd) noexcept;
// Whether anything was ever marked (a cheap pre-check).
bool AnyOwnFds() noexcept;

// Our own code: the shim's object and the modules it loads, whose calls to the names the
// shim interposes (fstat, close, ...) are about our descriptors, never the program's.
// NoteOwnCode records the object that holds `anchor` (any address inside it: a function,
// a module's dynamic section); IsOwnCode asks whether `pc` is in one recorded.
void NoteOwnCode(const void* anchor) noexcept;
bool IsOwnCode(const void* pc) noexcept;

// Calls `fn(fd)` for each descriptor of ours in [first, last], in ascending order. `fn`
// must not mark or forget descriptors.
template <typename Fn>
void ForEachOwnFd(unsigned first, unsigned last, Fn&& fn) noexcept;

// -- internals of ForEachOwnFd ------------------------------------------------------------
// The next marked number >= `from` and <= `last` (it may be stale: IsOwnFd decides), or -1.
int NextMarkedFd(unsigned from, unsigned last) noexcept;

template <typename Fn>
void ForEachOwnFd(unsigned first, unsigned last, Fn&& fn) noexcept {
  for (int fd = NextMarkedFd(first, last); fd >= 0; fd = NextMarkedFd(unsigned(fd) + 1, last)) {
    if (IsOwnFd(fd)) fn(fd);
    if (unsigned(fd) == last) break;
  }
}

}  // namespace slip
