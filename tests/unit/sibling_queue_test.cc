// The queue through which forked workers sharing a listener hand each other rendezvous
// connections (shm/sibling_queue.h): what one process passes on, another receives, whole
// (the connection still carries its unread message and descriptors), first in first out,
// a burst at a time; a pass is known again by the process that made it; and a sibling
// holding a connection is seen by the others only while that can still be true.
#include "shm/sibling_queue.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/sys.h"

namespace slip::shm {
namespace {

// A connected SEQPACKET pair with `text` and a memfd (SCM_RIGHTS) queued at end [1],
// unread, as a rendezvous connection holds a REGISTER. Returns end [1]; *writer keeps [0].
int QueuedConnection(const std::string& text, int* writer) {
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0) return -1;
  const int memfd = memfd_create("sibling-test", MFD_CLOEXEC);
  iovec iov{const_cast<char*>(text.data()), text.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh = sys::MessageOver(&iov, control, sizeof(control));
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
  EXPECT_EQ(sendmsg(ends[0], &mh, 0), ssize_t(text.size()));
  close(memfd);
  *writer = ends[0];
  return ends[1];
}

// Reads the message a passed connection still holds: its text, and whether a descriptor
// came with it.
std::string ReadQueued(int conn, bool* had_fd) {
  char buf[256];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr mh = sys::MessageOver(&iov, control, sizeof(control));
  const ssize_t n = recvmsg(conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  *had_fd = false;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_type != SCM_RIGHTS) continue;
    int fd;
    std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    struct stat st;
    *had_fd = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    close(fd);
  }
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

TEST(SiblingQueueTest, AConnectionPassedInOneProcessIsReceivedWholeInAnother) {
  auto queue = SiblingQueue::Create();
  ASSERT_TRUE(queue);
  int writer = -1;
  const int conn = QueuedConnection("register me", &writer);
  ASSERT_GE(conn, 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A sibling read it and found it is not for its connection: passes it on.
    _exit(queue->Pass(conn, 1234) != 0 ? 0 : 1);
  }
  close(conn);  // (the child's copy went into the queue)
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  SiblingQueue::Passed passed;
  const int got = queue->Receive(&passed);
  ASSERT_GE(got, sys::HiddenFdFloor()) << "received above the descriptor floor";
  EXPECT_EQ(passed.first_read_ms, 1234u);
  EXPECT_EQ(passed.passer, uint32_t(child));
  EXPECT_FALSE(queue->PassedHereSince(passed, 1)) << "another process's pass";
  bool had_fd = false;
  EXPECT_EQ(ReadQueued(got, &had_fd), "register me");
  EXPECT_TRUE(had_fd) << "the message's descriptor stays with it until read";
  close(got);
  close(writer);
  EXPECT_EQ(queue->Receive(&passed), -1) << "nothing more queued";
}

TEST(SiblingQueueTest, ABurstComesOutWholeInOrderAndKnowsItsPasser) {
  auto queue = SiblingQueue::Create();
  ASSERT_TRUE(queue);
  // More than a datagram socketpair's queue holds (net.unix.max_dgram_qlen, 10 here).
  constexpr int kBurst = 200;
  std::vector<int> writers;
  uint64_t first_seq = 0;
  for (int i = 0; i < kBurst; ++i) {
    int writer = -1;
    const int conn = QueuedConnection("registration " + std::to_string(i), &writer);
    ASSERT_GE(conn, 0);
    writers.push_back(writer);
    const uint64_t seq = queue->Pass(conn, uint64_t(i));
    ASSERT_NE(seq, 0u) << "pass " << i << " did not fit";
    if (i == 0) first_seq = seq;
  }
  for (int i = 0; i < kBurst; ++i) {
    SiblingQueue::Passed passed;
    const int got = queue->Receive(&passed);
    ASSERT_GE(got, 0) << i;
    EXPECT_EQ(passed.first_read_ms, uint64_t(i)) << "first in, first out";
    EXPECT_TRUE(queue->PassedHereSince(passed, first_seq));
    EXPECT_FALSE(queue->PassedHereSince(passed, first_seq + kBurst)) << "an earlier pass";
    bool had_fd = false;
    EXPECT_EQ(ReadQueued(got, &had_fd), "registration " + std::to_string(i));
    EXPECT_TRUE(had_fd);
    close(got);
  }
  for (int w : writers) close(w);
}

TEST(SiblingQueueTest, ASiblingHoldingIsSeenOnlyWhileItCanStillPassItOn) {
  auto queue = SiblingQueue::Create();
  ASSERT_TRUE(queue);
  EXPECT_FALSE(queue->SiblingHolds(sys::MonotonicMs()));
  queue->BeginHold(sys::MonotonicMs());
  EXPECT_FALSE(queue->SiblingHolds(sys::MonotonicMs())) << "its own hold is no sibling's";
  queue->EndHold();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    queue->BeginHold(sys::MonotonicMs());
    (void)!write(ready[1], "h", 1);
    pause();  // holds it until killed: as a sibling that died holding one
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  const uint64_t now = sys::MonotonicMs();
  EXPECT_TRUE(queue->SiblingHolds(now));
  EXPECT_FALSE(queue->SiblingHolds(now + 50)) << "a hold that old is not waited for";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace slip::shm
