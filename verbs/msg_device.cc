// verbs' message face: which RDMA devices the NCCL face offers, and the module's entry
// point for it (verbs/msg.h).
#include <arpa/inet.h>
#include <dirent.h>
#include <endian.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/msg_module.h"
#include "verbs/msg_internal.h"

namespace slip::verbs::msgimpl {

namespace {

// Mbit/s of a port: its lanes times each lane's rate (InfiniBand's encoding of both).
int PortSpeedMbps(const ibv_port_attr& port) noexcept {
  int lanes = 1;
  switch (port.active_width) {
    case 2:
      lanes = 4;
      break;
    case 4:
      lanes = 8;
      break;
    case 8:
      lanes = 12;
      break;
    case 16:
      lanes = 2;
      break;
    default:
      break;
  }
  int lane = 2500;
  switch (port.active_speed) {
    case 2:
      lane = 5000;
      break;
    case 4:
    case 8:
      lane = 10000;
      break;
    case 16:
      lane = 14000;
      break;
    case 32:
      lane = 25000;
      break;
    case 64:
      lane = 50000;
      break;
    case 128:
      lane = 100000;
      break;
    default:
      break;
  }
  return lanes * lane;
}

// The first IPv4 address (else a global IPv6 one) of the interfaces named or indexed.
bool AddressOf(const std::vector<unsigned>& ifindexes, const std::vector<std::string>& names,
               sockaddr_storage* out) noexcept {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (int family : {AF_INET, AF_INET6}) {
    for (ifaddrs* a = list; a && !found; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != family || !(a->ifa_flags & IFF_UP)) continue;
      if (family == AF_INET6 &&
          IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr))
        continue;
      bool match = false;
      const unsigned index = if_nametoindex(a->ifa_name);
      for (unsigned i : ifindexes) match = match || i == index;
      for (const std::string& n : names) match = match || n == a->ifa_name;
      if (!match) continue;
      *out = sockaddr_storage{};
      std::memcpy(out, a->ifa_addr, family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
      found = true;
    }
    if (found) break;
  }
  freeifaddrs(list);
  return found;
}

// The address rdma_cm reaches the port by: an address of a netdev in the port's GID table
// (RoCE), else of the device's own network interface (IPoIB).
bool PortAddress(ibv_context* context, uint8_t port, const ibv_port_attr& attr,
                 sockaddr_storage* out) {
  std::vector<unsigned> ifindexes;
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid_entry entry{};
    if (ibv_query_gid_ex(context, port, uint32_t(i), &entry, 0) == 0 && entry.ndev_ifindex != 0)
      ifindexes.push_back(entry.ndev_ifindex);
  }
  std::vector<std::string> names;
  const std::string dir =
      std::string("/sys/class/infiniband/") + ibv_get_device_name(context->device) + "/device/net";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    closedir(d);
  }
  return AddressOf(ifindexes, names, out);
}

// Does the device register DMA-BUF memory? An fd of -1 is refused as a bad descriptor by a
// device (and kernel) that could, and as unsupported by one that cannot (NCCL's own test).
bool DmaBufRegistration(ibv_context* context) noexcept {
  ibv_pd* pd = ibv_alloc_pd(context);
  if (!pd) return false;
  errno = 0;
  ibv_mr* mr = ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, IBV_ACCESS_LOCAL_WRITE);
  const bool supported = !mr && errno != EOPNOTSUPP && errno != EPROTONOSUPPORT && errno != 0;
  if (mr) ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  return supported;
}

// nvidia-peermem (or the older nv_peer_mem) lets ibv_reg_mr take GPU addresses.
bool PeerMemoryClient() noexcept {
  for (const char* path : {"/sys/module/nvidia_peermem", "/sys/module/nv_peer_mem",
                           "/sys/kernel/mm/memory_peers/nv_mem/version"})
    if (access(path, F_OK) == 0) return true;
  return false;
}

void FillInfo(ibv_context* context, const ibv_port_attr& port, msg::DeviceInfo* info) noexcept {
  const char* name = ibv_get_device_name(context->device);
  snprintf(info->name, sizeof(info->name), "%s", name);
  // The PCI function's sysfs path, as NCCL's topology wants it; a virtual device (rxe,
  // siw) has none, and NCCL then places it at the CPU.
  char link[128];
  snprintf(link, sizeof(link), "/sys/class/infiniband/%s/device", name);
  char real[PATH_MAX];
  if (realpath(link, real) && strstr(real, "/pci") && strlen(real) < sizeof(info->pci_path))
    std::memcpy(info->pci_path, real, strlen(real) + 1);
  info->guid = be64toh(ibv_get_device_guid(context->device));
  info->speed_mbps = PortSpeedMbps(port);
  info->registers = true;
  info->dmabuf = DmaBufRegistration(context);
  info->peer_memory = PeerMemoryClient();
}

msg::Found Enumerate() {
  msg::Found found;
  int n = 0;
  ibv_context** contexts = rdma_get_devices(&n);
  if (!contexts || n == 0) {
    if (contexts) rdma_free_devices(contexts);
    found.why = "no RDMA device";
    return found;
  }
  std::string skipped;
  for (int i = 0; i < n; ++i) {
    ibv_context* context = contexts[i];
    const char* name = ibv_get_device_name(context->device);
    if (!msg::KeptSetup<MessageSetup>().options->device.empty() &&
        msg::KeptSetup<MessageSetup>().options->device != name)
      continue;
    ibv_device_attr dev{};
    if (ibv_query_device(context, &dev) != 0) continue;
    bool added = false;
    for (uint8_t p = 1; p <= dev.phys_port_cnt && !added; ++p) {
      ibv_port_attr port{};
      if (ibv_query_port(context, p, &port) != 0 || port.state != IBV_PORT_ACTIVE) continue;
      Device d;
      d.context = context;
      d.port = p;
      if (!PortAddress(context, p, port, &d.address)) continue;
      FillInfo(context, port, &d.info);
      if (auto t = MakeTransport(d)) {
        char text[INET6_ADDRSTRLEN] = "?";
        const void* raw =
            d.address.ss_family == AF_INET
                ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&d.address)->sin_addr)
                : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&d.address)->sin6_addr);
        inet_ntop(d.address.ss_family, raw, text, sizeof(text));
        SLIP_LOG(kInfo,
                 "verbs: NCCL device %s port %u (%s, %d Mbit/s; GPU memory by DMA-BUF %s, by "
                 "peer memory %s)",
                 name, unsigned(p), text, d.info.speed_mbps, d.info.dmabuf ? "yes" : "no",
                 d.info.peer_memory ? "yes" : "no");
        found.transports.push_back(std::move(t));
        added = true;
      }
    }
    if (!added) skipped += std::string(skipped.empty() ? "" : ", ") + name;
  }
  rdma_free_devices(contexts);  // the contexts stay open (librdmacm's)
  if (found.transports.empty()) {
    found.why = skipped.empty() ? "no RDMA device named by SLIP_DEVICE"
                                : "no active port with an IP address on " + skipped;
  }
  return found;
}

}  // namespace

}  // namespace slip::verbs::msgimpl

SLIP_MESSAGE_ENTRY(slip_verbs_message_transports, slip::verbs::MessageSetup,
                   "libslipstream-verbs.so",
                   [] { return new slip::msg::Found(slip::verbs::msgimpl::Enumerate()); })
