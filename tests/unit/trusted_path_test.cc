// Tests for paths another user may control (core/trusted_path.h): which directories are
// trusted (owner, mode, sticky, every ancestor, links), what the descriptor is good for
// afterwards, and which files are opened for our logs and stats (never a link, a FIFO, a
// device, another user's file or one with other names). Most cases need root, to make
// directories and files of another uid (nobody) as the attacker would.
#include "core/trusted_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace slip {
namespace {

constexpr uid_t kNobody = 65534;

// A fresh root-owned 0755 directory under /tmp, removed with everything in it.
class TrustedPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/slip-ut-path-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    ASSERT_EQ(chmod(base_.c_str(), 0755), 0);
  }
  void TearDown() override {
    const std::string cmd = "rm -rf '" + base_ + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  std::string Sub(const char* name, mode_t mode, uid_t owner = 0) {
    const std::string path = base_ + "/" + name;
    EXPECT_EQ(mkdir(path.c_str(), 0700), 0);
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    if (owner != 0) {
      EXPECT_EQ(chown(path.c_str(), owner, owner), 0);
    }
    return path;
  }
  static bool Trusted(const std::string& path, std::string* why = nullptr) {
    TrustedDir dir;
    PathVerdict verdict;
    const bool ok = dir.Open(path.c_str(), 0, &verdict);
    if (why) *why = verdict.why;
    return ok;
  }
  static bool NeedRoot() { return geteuid() == 0; }

  std::string base_;
};

TEST_F(TrustedPathTest, OwnersAndModes) {
  if (!NeedRoot()) GTEST_SKIP() << "needs root (directories of another uid)";
  std::string why;
  EXPECT_TRUE(Trusted(base_));
  EXPECT_TRUE(Trusted(Sub("own0700", 0700)));
  EXPECT_TRUE(Trusted(Sub("sticky", 01777)));  // root's, sticky: /tmp's rule
  EXPECT_FALSE(Trusted(Sub("open", 0777), &why));
  EXPECT_NE(why.find("writable by other users"), std::string::npos) << why;
  EXPECT_FALSE(Trusted(Sub("group", 0775), &why));
  EXPECT_FALSE(Trusted(Sub("nobodys", 0755, kNobody), &why));
  EXPECT_NE(why.find("owned by another user"), std::string::npos) << why;
  EXPECT_FALSE(Trusted(Sub("nobodys_sticky", 01777, kNobody)));  // sticky, but not root's
}

TEST_F(TrustedPathTest, EveryAncestorCounts) {
  if (!NeedRoot()) GTEST_SKIP() << "needs root (directories of another uid)";
  // A root-owned 0755 directory inside nobody's: nobody can rename it away and put its own
  // in its place, so it is not trusted either.
  const std::string outer = Sub("outer", 0755, kNobody);
  const std::string inner = outer + "/inner";
  ASSERT_EQ(mkdir(inner.c_str(), 0755), 0);
  std::string why;
  EXPECT_FALSE(Trusted(inner, &why));
  EXPECT_NE(why.find(outer), std::string::npos) << why;
  // Under a root sticky directory, a root 0755 one is trusted.
  const std::string sticky = Sub("st", 01777);
  const std::string safe = sticky + "/safe";
  ASSERT_EQ(mkdir(safe.c_str(), 0755), 0);
  EXPECT_TRUE(Trusted(safe));
}

TEST_F(TrustedPathTest, LinksAreFollowedOnlyAsTheirTrustedMakersMadeThem) {
  const std::string real = Sub("real", 0755);
  // A link of ours (or root's) in a trusted directory: followed, its target checked the
  // same way (/var/run -> /run).
  const std::string link = base_ + "/link";
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  EXPECT_TRUE(Trusted(link));
  ASSERT_EQ(symlink("real", (base_ + "/relative").c_str()), 0);
  EXPECT_TRUE(Trusted(base_ + "/relative"));
  EXPECT_TRUE(Trusted(real + "/../real"));
  EXPECT_TRUE(Trusted(real + "/./"));  // "." and trailing slashes are no components
  // A loop ends.
  ASSERT_EQ(symlink("loop", (base_ + "/loop").c_str()), 0);
  std::string why;
  EXPECT_FALSE(Trusted(base_ + "/loop", &why));
  EXPECT_NE(why.find("cannot be followed"), std::string::npos) << why;
  // Missing, or not a directory.
  EXPECT_FALSE(Trusted(base_ + "/missing", &why));
  const std::string file = base_ + "/file";
  close(open(file.c_str(), O_CREAT | O_WRONLY, 0644));
  EXPECT_FALSE(Trusted(file, &why));
  EXPECT_NE(why.find("not a directory"), std::string::npos) << why;
  if (!NeedRoot()) return;
  // A link to a directory nobody controls: its target is not trusted.
  const std::string nobodys = Sub("nobodys", 0755, kNobody);
  ASSERT_EQ(symlink(nobodys.c_str(), (base_ + "/to_nobodys").c_str()), 0);
  EXPECT_FALSE(Trusted(base_ + "/to_nobodys", &why));
  EXPECT_NE(why.find("owned by another user"), std::string::npos) << why;
  // A link nobody made in root's sticky directory, even to a trusted target: not followed.
  const std::string sticky = Sub("sticky", 01777);
  const std::string theirs = sticky + "/theirs";
  ASSERT_EQ(symlink(real.c_str(), theirs.c_str()), 0);
  ASSERT_EQ(lchown(theirs.c_str(), kNobody, kNobody), 0);
  EXPECT_FALSE(Trusted(theirs, &why));
  EXPECT_NE(why.find("symbolic link of another user"), std::string::npos) << why;
}

TEST_F(TrustedPathTest, TheDescriptorIsWhatIsUsedAfterwards) {
  const std::string real = Sub("d", 0755);
  TrustedDir dir;
  PathVerdict verdict;
  ASSERT_TRUE(dir.Open(real.c_str(), 100, &verdict)) << verdict.why;
  EXPECT_GE(dir.fd(), 100);
  EXPECT_EQ(dir.owner(), geteuid());
  EXPECT_FALSE(dir.shared());
  EXPECT_TRUE(dir.StillValid());
  // A socket bound through its address is in the directory, whatever the path names now.
  sockaddr_un addr;
  socklen_t len;
  ASSERT_TRUE(dir.Address("s", &addr, &len));
  const int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), len), 0);
  const std::string moved = base_ + "/moved";
  ASSERT_EQ(rename(real.c_str(), moved.c_str()), 0);
  ASSERT_EQ(mkdir(real.c_str(), 0755), 0);  // a new one at the old path
  struct stat st;
  EXPECT_EQ(dir.Stat("s", &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(stat((moved + "/s").c_str(), &st), 0);
  // Opened to every user without following a link; a link in its place is refused.
  EXPECT_EQ(dir.OpenSocketToAll("s"), 0);
  EXPECT_EQ(dir.Stat("s", &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  const std::string target = base_ + "/target";
  close(open(target.c_str(), O_CREAT | O_WRONLY, 0600));
  ASSERT_EQ(symlink(target.c_str(), (moved + "/l").c_str()), 0);
  EXPECT_NE(dir.OpenSocketToAll("l"), 0);
  ASSERT_EQ(stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "chmod followed the link";
  // Removed only while it is still the same socket.
  EXPECT_FALSE(dir.RemoveSocket("l", 0));
  EXPECT_FALSE(dir.RemoveSocket("s", st.st_ino + 1000));
  ASSERT_EQ(dir.Stat("s", &st), 0);
  EXPECT_TRUE(dir.RemoveSocket("s", st.st_ino));
  EXPECT_NE(dir.Stat("s", &st), 0);
  close(s);
  // Opened to other users' writes since, or given to another user: no longer valid.
  ASSERT_EQ(chmod(moved.c_str(), 0777), 0);
  EXPECT_FALSE(dir.StillValid());
  ASSERT_EQ(chmod(moved.c_str(), 0755), 0);
  EXPECT_TRUE(dir.StillValid());
  if (NeedRoot()) {
    ASSERT_EQ(chown(moved.c_str(), kNobody, kNobody), 0);
    EXPECT_FALSE(dir.StillValid());
    ASSERT_EQ(chown(moved.c_str(), 0, 0), 0);
    EXPECT_TRUE(dir.StillValid());
  }
  // Gone: no longer valid.
  TrustedDir copy;
  ASSERT_TRUE(dir.Duplicate(0, &copy));
  EXPECT_TRUE(copy.StillValid());
  ASSERT_EQ(unlink((moved + "/l").c_str()), 0);
  ASSERT_EQ(rmdir(moved.c_str()), 0);
  EXPECT_FALSE(dir.StillValid());
  EXPECT_FALSE(copy.StillValid());
}

TEST_F(TrustedPathTest, OwnFilesOnly) {
  const std::string dir = Sub("logs", 0755);
  PathVerdict verdict;
  // Created exclusively when missing, then opened again for appending.
  const std::string log = dir + "/slip.log";
  int fd = OpenOwnFileForAppend(log.c_str(), &verdict);
  ASSERT_GE(fd, 0) << verdict.why;
  ASSERT_EQ(write(fd, "a", 1), 1);
  close(fd);
  fd = OpenOwnFileForAppend(log.c_str(), &verdict);
  ASSERT_GE(fd, 0) << verdict.why;
  ASSERT_EQ(write(fd, "b", 1), 1);
  close(fd);
  fd = OpenOwnFileForRead(log.c_str(), &verdict);
  ASSERT_GE(fd, 0) << verdict.why;
  char buf[4] = {};
  EXPECT_EQ(read(fd, buf, sizeof(buf)), 2);
  EXPECT_STREQ(buf, "ab");
  close(fd);
  // Reading never creates.
  EXPECT_LT(OpenOwnFileForRead((dir + "/none").c_str(), &verdict), 0);
  struct stat st;
  EXPECT_NE(stat((dir + "/none").c_str(), &st), 0);
  // A link to a file of ours is refused, and the file is untouched.
  const std::string victim = base_ + "/victim";
  close(open(victim.c_str(), O_CREAT | O_WRONLY, 0600));
  ASSERT_EQ(symlink(victim.c_str(), (dir + "/link.log").c_str()), 0);
  EXPECT_LT(OpenOwnFileForAppend((dir + "/link.log").c_str(), &verdict), 0);
  EXPECT_NE(std::string(verdict.why).find("symbolic link"), std::string::npos) << verdict.why;
  // So is a hard link to it (another name of a file we own).
  ASSERT_EQ(link(victim.c_str(), (dir + "/hard.log").c_str()), 0);
  EXPECT_LT(OpenOwnFileForAppend((dir + "/hard.log").c_str(), &verdict), 0);
  EXPECT_NE(std::string(verdict.why).find("other names"), std::string::npos) << verdict.why;
  ASSERT_EQ(stat(victim.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  // A FIFO is refused at once, with or without a reader: never waited on.
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_LT(OpenOwnFileForAppend((dir + "/fifo").c_str(), &verdict), 0);
  const int reader = open((dir + "/fifo").c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  EXPECT_LT(OpenOwnFileForAppend((dir + "/fifo").c_str(), &verdict), 0);
  EXPECT_LT(OpenOwnFileForRead((dir + "/fifo").c_str(), &verdict), 0);
  close(reader);
  // A device, a directory.
  EXPECT_LT(OpenOwnFileForRead("/dev/zero", &verdict), 0);
  EXPECT_LT(OpenOwnFileForAppend(dir.c_str(), &verdict), 0);
  EXPECT_LT(OpenOwnFileForAppend((dir + "/").c_str(), &verdict), 0);
}

TEST_F(TrustedPathTest, ProcessesCreatingTheSameFileAtOnceAllOpenIt) {
  // A server's workers exit together and append their stats to one file that none has
  // made yet: each loser of the exclusive create opens the winner's file.
  const std::string dir = Sub("stats", 0755);
  constexpr int kProcs = 8;
  constexpr int kRounds = 50;
  for (int round = 0; round < kRounds; ++round) {
    const std::string file = dir + "/s" + std::to_string(round);
    int go[2];
    ASSERT_EQ(pipe(go), 0);
    pid_t kids[kProcs];
    for (pid_t& kid : kids) {
      kid = fork();
      ASSERT_GE(kid, 0);
      if (kid == 0) {
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) != 0) _exit(3);  // all start when the pipe closes
        PathVerdict verdict;
        const int fd = OpenOwnFileForAppend(file.c_str(), &verdict);
        if (fd < 0) _exit(1);
        _exit(write(fd, "x", 1) == 1 ? 0 : 2);
      }
    }
    close(go[0]);
    close(go[1]);
    int failed = 0;
    for (pid_t kid : kids) {
      int status = 0;
      ASSERT_EQ(waitpid(kid, &status, 0), kid);
      failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    struct stat st;
    ASSERT_EQ(stat(file.c_str(), &st), 0);
    ASSERT_EQ(failed, 0) << "round " << round;
    ASSERT_EQ(st.st_size, kProcs);
  }
}

TEST_F(TrustedPathTest, FilesOfOthersOrInOthersDirectories) {
  if (!NeedRoot()) GTEST_SKIP() << "needs root (files of another uid)";
  PathVerdict verdict;
  const std::string open_dir = Sub("tmp", 01777);  // /tmp's kind: trusted for our own files
  const std::string theirs = open_dir + "/theirs.log";
  close(open(theirs.c_str(), O_CREAT | O_WRONLY, 0666));
  ASSERT_EQ(chown(theirs.c_str(), kNobody, kNobody), 0);
  EXPECT_LT(OpenOwnFileForAppend(theirs.c_str(), &verdict), 0);
  EXPECT_NE(std::string(verdict.why).find("another user"), std::string::npos) << verdict.why;
  const int fd = OpenOwnFileForAppend((open_dir + "/mine.log").c_str(), &verdict);
  EXPECT_GE(fd, 0) << verdict.why;
  if (fd >= 0) close(fd);
  // In a directory of nobody's, even our own file is not opened (nobody could swap it).
  const std::string nobodys = Sub("nobodys", 0755, kNobody);
  EXPECT_LT(OpenOwnFileForAppend((nobodys + "/x.log").c_str(), &verdict), 0);
  EXPECT_NE(std::string(verdict.why).find("owned by another user"), std::string::npos)
      << verdict.why;
  struct stat st;
  EXPECT_NE(stat((nobodys + "/x.log").c_str(), &st), 0) << "created in an untrusted directory";
}

TEST_F(TrustedPathTest, RelativePathsAreTakenFromTheWorkingDirectory) {
  const std::string dir = Sub("cwd", 0755);
  char old[4096];
  ASSERT_NE(getcwd(old, sizeof(old)), nullptr);
  ASSERT_EQ(chdir(dir.c_str()), 0);
  PathVerdict verdict;
  const int fd = OpenOwnFileForAppend("rel.log", &verdict);
  EXPECT_GE(fd, 0) << verdict.why;
  if (fd >= 0) close(fd);
  TrustedDir here;
  EXPECT_TRUE(here.Open(".", 0, &verdict)) << verdict.why;
  ASSERT_EQ(chdir(old), 0);
  struct stat st;
  EXPECT_EQ(stat((dir + "/rel.log").c_str(), &st), 0);
}

}  // namespace
}  // namespace slip
