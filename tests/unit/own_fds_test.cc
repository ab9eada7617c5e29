// Tests for the table of Slipstream's own descriptors (core/own_fds.h): what a mark means,
// how a stale one is recognised (the number closed under us, or reused for another file),
// that the sys:: helpers mark what they make and forget what they close, and the walk
// close_range() relies on.
#include "core/own_fds.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

#include "core/sys.h"

namespace slip {
namespace {

class OwnFdsTest : public ::testing::Test {
 protected:
  void SetUp() override { EnableOwnFds(); }
  static int RawClose(int fd) { return int(::syscall(SYS_close, fd)); }
};

TEST_F(OwnFdsTest, AMarkHoldsOnlyWhileTheNumberRefersToWhatWasMarked) {
  const int fd = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(IsOwnFd(fd));
  MarkOwnFd(fd);
  EXPECT_TRUE(OwnFdMarked(fd));
  EXPECT_TRUE(IsOwnFd(fd));
  EXPECT_TRUE(AnyOwnFds());
  // Closed behind the table's back (a raw system call), the number reused for a file of
  // someone else's: not ours, and the stale mark is gone after the first question.
  ASSERT_EQ(RawClose(fd), 0);
  const int file = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(file, fd) << "the kernel gives the lowest free number";
  EXPECT_TRUE(OwnFdMarked(file));
  EXPECT_FALSE(IsOwnFd(file));
  EXPECT_FALSE(OwnFdMarked(file));
  close(file);
  // Closed and not reused: not ours either.
  const int other = eventfd(0, EFD_CLOEXEC);
  MarkOwnFd(other);
  ASSERT_EQ(RawClose(other), 0);
  EXPECT_FALSE(IsOwnFd(other));
  EXPECT_FALSE(IsOwnFd(-1));
  EXPECT_FALSE(IsOwnFd(1 << 30));  // beyond the table: never marked
  MarkOwnFd(1 << 30);
}

TEST_F(OwnFdsTest, TheHelpersMarkWhatTheyMakeAndForgetWhatTheyClose) {
  const int floor = 700;
  const int moved = sys::MoveAbove(eventfd(0, EFD_CLOEXEC), floor);
  ASSERT_GE(moved, floor);
  EXPECT_TRUE(IsOwnFd(moved));
  const int copy = sys::DupAbove(moved, floor);
  ASSERT_GE(copy, floor);
  EXPECT_TRUE(IsOwnFd(copy));
  const int high = sys::MoveHigh(eventfd(0, EFD_CLOEXEC), floor);
  EXPECT_TRUE(IsOwnFd(high));
  const int library = sys::MoveLibraryFdHigh(eventfd(0, EFD_CLOEXEC), floor);
  ASSERT_GE(library, floor);
  EXPECT_FALSE(OwnFdMarked(library)) << "a library's descriptor is the library's to close";
  // dup3 onto one of ours: the mark follows what the number now refers to.
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(sys::dup3(null, copy, O_CLOEXEC), copy);
  EXPECT_TRUE(IsOwnFd(copy));
  close(null);
  sys::close(copy);
  EXPECT_FALSE(OwnFdMarked(copy));
  sys::close(moved);
  sys::close(high);
  sys::close(library);
  EXPECT_FALSE(OwnFdMarked(moved));
}

TEST_F(OwnFdsTest, TheWalkVisitsOursInOrderAcrossPages) {
  // Numbers in three pages of the table, one of them closed under us (skipped).
  std::vector<int> ours;
  for (int target : {1500, 1501, 2047, 2048, 5000}) {
    const int fd = sys::MoveAbove(eventfd(0, EFD_CLOEXEC), target);
    ASSERT_GE(fd, target);
    ours.push_back(fd);
  }
  ASSERT_EQ(RawClose(ours[2]), 0);
  std::vector<int> seen;
  ForEachOwnFd(1400, 6000, [&](int fd) { seen.push_back(fd); });
  EXPECT_EQ(seen, (std::vector<int>{ours[0], ours[1], ours[3], ours[4]}));
  seen.clear();
  ForEachOwnFd(unsigned(ours[1]), unsigned(ours[3]), [&](int fd) { seen.push_back(fd); });
  EXPECT_EQ(seen, (std::vector<int>{ours[1], ours[3]}));
  seen.clear();
  ForEachOwnFd(unsigned(ours[4]) + 1, ~0u, [&](int fd) { seen.push_back(fd); });
  EXPECT_TRUE(seen.empty());
  for (int fd : ours) sys::close(fd);
}

}  // namespace
}  // namespace slip
