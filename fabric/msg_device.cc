// fabric's devices for the NCCL face: the chosen provider's domains, opened once per
// process, and the module's entry point (fabric/msg.h).
#include <limits.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/msg_module.h"
#include "fabric/msg_internal.h"

namespace slip::fabric::msgimpl {

namespace {

constexpr int kMaxDevices = 4;

// "tcp-eth0", "shm", "verbs-rxe0", "efa-rdmap0s6-rdm": the core provider and the domain.
void DeviceName(const Domain& d, char* out, size_t len) noexcept {
  const char* provider = d.provider();
  const char* semicolon = strchr(provider, ';');
  const int core = semicolon ? int(semicolon - provider) : int(strlen(provider));
  if (strncmp(provider, d.name(), size_t(core)) == 0 && d.name()[core] == '\0')
    snprintf(out, len, "%.*s", core, provider);
  else
    snprintf(out, len, "%.*s-%s", core, provider, d.name());
}

void FillInfo(const Domain& d, msg::DeviceInfo* info) noexcept {
  DeviceName(d, info->name, sizeof(info->name));
  info->registers = true;  // registrations spare providers that need them a copy or a lookup
  info->speed_mbps = 10000;
  const fid_nic* nic = d.info().nic;
  if (nic && nic->link_attr && nic->link_attr->speed > 0)
    info->speed_mbps = int(nic->link_attr->speed / 1000000);
  if (nic && nic->bus_attr && nic->bus_attr->bus_type == FI_BUS_PCI) {
    const fi_pci_attr& pci = nic->bus_attr->attr.pci;
    char path[96], real[PATH_MAX];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%04x:%02x:%02x.%x", pci.domain_id,
             pci.bus_id, pci.device_id, pci.function_id);
    if (realpath(path, real) && strlen(real) < sizeof(info->pci_path))
      memcpy(info->pci_path, real, strlen(real) + 1);
  }
}

struct Found : msg::Found {
  std::vector<Device> devices;  // what the transports use
};

Found* Enumerate() {
  auto* found = new Found();
  std::vector<InfoPtr> domains = FindDomains(msg::KeptSetup<MessageSetup>().options->provider,
                                             Use::kTaggedMessages, &found->why);
  found->devices.reserve(kMaxDevices);  // (transports keep references to the devices)
  for (InfoPtr& info : domains) {
    if (found->devices.size() == kMaxDevices) break;
    const bool string_address = info->addr_format == FI_ADDR_STR;
    const size_t address_len = string_address ? 0 : info->src_addrlen;
    std::string why;
    std::unique_ptr<Domain> domain = Domain::Open(std::move(info), &why);
    if (!domain) {
      found->why = why;
      SLIP_LOG(kInfo, "fabric: a domain cannot be opened: %s", why.c_str());
      continue;
    }
    Device& d = found->devices.emplace_back();
    d.domain = std::move(domain);
    d.address_len = address_len;
    FillInfo(*d.domain, &d.info);
    SLIP_LOG(kInfo, "fabric: device %s (provider %s, domain %s%s%s)", d.info.name,
             d.domain->provider(), d.domain->name(),
             d.domain->directed_recv() ? ", directed receives" : "",
             d.domain->delivery_complete() ? ", delivery complete" : "");
  }
  for (const Device& d : found->devices) {
    auto t = MakeTransport(d);
    if (t) found->transports.push_back(std::move(t));
  }
  if (found->transports.empty() && found->why.empty()) found->why = "no domain could be opened";
  return found;
}

}  // namespace

}  // namespace slip::fabric::msgimpl

SLIP_MESSAGE_ENTRY(slip_fabric_message_transports, slip::fabric::MessageSetup,
                   "libslipstream-fabric.so", slip::fabric::msgimpl::Enumerate)
