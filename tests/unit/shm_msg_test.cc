// shm's message comms (shm/msg.h) directly, where the plugin's harness cannot reach: a
// sender in another network namespace of this host (a pod) reaching a listener through the
// rendezvous directory.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/msg_comm.h"
#include "shm/msg.h"
#include "shm/msg_wire.h"

namespace slip {
namespace {

using Clock = std::chrono::steady_clock;

bool WaitDone(msg::Request* req, size_t* size) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  bool done = false;
  size_t sizes[msg::kMaxGroup];
  int count = 0;
  while (!done && Clock::now() < deadline)
    if (msg::Test(req, &done, sizes, &count) != msg::Status::kOk) return false;
  if (done && size) *size = sizes[0];
  return done;
}

TEST(ShmMessageComms, ReachAnotherNetworkNamespaceThroughTheDirectory) {
  char dir[] = "/tmp/slip-msg-dirXXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  shm::SetMessageRendezvousDir(dir);
  msg::Transport* t = shm::MessageTransport();
  uint8_t handle[msg::kHandleBytes];
  std::unique_ptr<msg::Listener> listener;
  ASSERT_EQ(t->Listen(handle, &listener), msg::Status::kOk);
  shm::msgwire::Handle h;
  ASSERT_TRUE(shm::msgwire::ParseHandle(handle, sizeof(handle), &h));
  EXPECT_TRUE(h.flags & shm::msgwire::kHandleInDir);

  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    // A pod: its own network namespace, where the listener's abstract name is not.
    const char verdict = unshare(CLONE_NEWNET) == 0 ? 'y' : 'n';
    (void)!write(ready[1], &verdict, 1);
    if (verdict != 'y') _exit(0);
    std::unique_ptr<msg::SendComm> send;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    msg::Status st = msg::Status::kAgain;
    while (st == msg::Status::kAgain && Clock::now() < deadline) st = t->Connect(handle, &send);
    if (st != msg::Status::kOk) _exit(2);
    std::vector<uint8_t> data(3 << 20);
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + 3);
    msg::Request* req = nullptr;
    while (req == nullptr && Clock::now() < deadline) {
      // (kAgain until the receiver has posted its receive.)
      const msg::Status sent = send->Send(data.data(), data.size(), 5, nullptr, &req);
      if (sent != msg::Status::kOk && sent != msg::Status::kAgain) _exit(3);
    }
    if (req == nullptr || !WaitDone(req, nullptr)) _exit(4);
    _exit(0);
  }
  char verdict = 0;
  ASSERT_EQ(read(ready[0], &verdict, 1), 1);
  if (verdict != 'y') {
    waitpid(pid, nullptr, 0);
    GTEST_SKIP() << "no new network namespace here (needs CAP_SYS_ADMIN)";
  }
  std::unique_ptr<msg::RecvComm> recv;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!recv && Clock::now() < deadline) ASSERT_NE(listener->Accept(&recv), msg::Status::kRemote);
  ASSERT_TRUE(recv);
  std::vector<uint8_t> out(4 << 20);
  void* data = out.data();
  const size_t cap = out.size();
  const int tag = 5;
  msg::Request* req = nullptr;
  ASSERT_EQ(recv->Recv(1, &data, &cap, &tag, nullptr, &req), msg::Status::kOk);
  size_t got = 0;
  ASSERT_TRUE(WaitDone(req, &got));
  ASSERT_EQ(got, size_t(3) << 20);
  for (size_t i = 0; i < got; ++i) ASSERT_EQ(out[i], uint8_t(i * 7 + 3)) << i;
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  recv.reset();
  listener.reset();  // unlinks its name in the directory
  EXPECT_EQ(rmdir(dir), 0) << "the listener left its name behind";
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace slip
