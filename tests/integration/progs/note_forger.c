// A host on the fabric that forges notes for another host's connection.
//
// usage: note_forger PROVIDER PORT SOURCE_PORT CURSOR [rdm|msg]
//
// Opens an RDM endpoint of its own on libfabric's PROVIDER (msg: a connected endpoint, as
// the listener's streams use with SLIP_FABRIC_ENDPOINT=msg), asks the fabric listener on
// 127.0.0.1:PORT for a connection of its own (a REQ for 127.0.0.1:SOURCE_PORT -> PORT with
// its real endpoint address, so that the listener takes it for a peer), and from the REP
// learns the listener's endpoint, a registration key of the listener's (its pending ring)
// and the note tag of that request. The listener's connections made before it have the
// tags just below (tags are handed out in order), so it writes, for each of the 8 tags
// below its own, empty writes whose remote CQ data is a data note saying CURSOR, and a
// 4-byte note of the same kind (the word form), and (msg) a 4-byte cursor note saying
// CURSOR, which names no connection at all: a listener that believed any of them for
// another connection than the forger's own would deliver bytes its client never sent.
// msg: before its own, it connects an endpoint naming the connection just below its tag
// with a nonce of its own: the listener must refuse that ("hijack": "refused", within
// "hijack_ms": a request it leaves unanswered holds the provider's socket); then it
// connects its own endpoint with its REQ's nonce, which the listener takes, and writes the
// notes through it. A listener whose streams send (SLIP_FABRIC_DATA=send: form 31, no
// ring key) takes messages instead of writes: the forger sends, through its own endpoint,
// an empty data note, a 16-byte message whose note says CURSOR, and an EOF past its bytes,
// each of which the listener must refuse (resetting the forger's connection only).
// Prints {"rep": true|false, "tag": T, "notes": N} (N: notes that completed here).
// With a sixth argument "hold" (rdm): the REQ names a ring key that is none of its
// registrations (it registers nothing) and it forges no notes; it prints
// {"rep": true, "nonce": N, "ring": BYTES} for the caller, which connects the TCP
// connection with the CONFIRM of that nonce, and then takes its queue in for HOLD_S
// seconds: the listener's writes for that connection arrive here and are refused.
// The wire format is written out here independently of fabric/stream_wire.cc.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MSG_BYTES 144
#define HOLD_S 3

static void put_endpoint(uint8_t* at, uint16_t port) {
  at[0] = 4;
  at[1] = 0;
  at[2] = (uint8_t)(port & 0xff);
  at[3] = (uint8_t)(port >> 8);
  memset(at + 4, 0, 16);
  const uint32_t ip = htonl(INADDR_LOOPBACK);
  memcpy(at + 4, &ip, 4);
}

static void put_le(uint8_t* at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) at[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t* at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | at[i];
  return v;
}

// The next event on `eq` within 2 s: FI_CONNECTED, FI_SHUTDOWN, or -1 (an error entry,
// a refused connection) / 0 (nothing).
static int next_event(struct fid_eq* eq) {
  uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
  uint32_t kind = 0;
  const ssize_t n = fi_eq_sread(eq, &kind, buf, sizeof(buf), 2000, 0);
  if (n == -FI_EAVAIL) {
    struct fi_eq_err_entry err = {0};
    fi_eq_readerr(eq, &err, 0);
    return -1;
  }
  return n > 0 ? (int)kind : 0;
}

// A connected endpoint to `server`, whose connection data names `tag` and `nonce`.
static struct fid_ep* connect_ep(struct fid_domain* domain, struct fi_info* info, struct fid_cq* cq,
                                 struct fid_eq* eq, const void* server, uint32_t tag,
                                 uint64_t nonce) {
  struct fid_ep* ep = NULL;
  if (fi_endpoint(domain, info, &ep, NULL) != 0) return NULL;
  uint8_t param[16];
  put_le(param, 0x53464c43, 4);
  put_le(param + 4, tag, 4);
  put_le(param + 8, nonce, 8);
  if (fi_ep_bind(ep, &eq->fid, 0) != 0 || fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) != 0 ||
      fi_enable(ep) != 0 || fi_connect(ep, server, param, sizeof(param)) != 0) {
    fi_close(&ep->fid);
    return NULL;
  }
  if (next_event(eq) != FI_CONNECTED) {
    fi_close(&ep->fid);
    return NULL;
  }
  return ep;
}

// Closes what main opened. An shm endpoint left open at exit leaves its region file in
// /dev/shm ("<pid>:0:0"), and a later forger given the same pid cannot enable its own.
static void close_fabric(struct fid_ep* ep, struct fid_cq* cq, struct fid_eq* eq, struct fid_av* av,
                         struct fid_domain* domain, struct fid_fabric* fabric) {
  if (ep) fi_close(&ep->fid);
  fi_close(&cq->fid);
  if (eq) fi_close(&eq->fid);
  if (av) fi_close(&av->fid);
  fi_close(&domain->fid);
  fi_close(&fabric->fid);
}

static long elapsed_ms(const struct timespec* since) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (now.tv_sec - since->tv_sec) * 1000 + (now.tv_nsec - since->tv_nsec) / 1000000;
}

static int fail(const char* what, int rc) {
  fprintf(stderr, "note_forger: %s: %s (%d)\n", what, fi_strerror(-rc), rc);
  printf("{\"rep\": false, \"tag\": 0, \"notes\": 0, \"error\": \"%s\"}\n", what);
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 5 || argc > 7) {
    fprintf(stderr, "usage: note_forger PROVIDER PORT SOURCE_PORT CURSOR [rdm|msg [hold]]\n");
    return 2;
  }
  const int connected = argc >= 6 && strcmp(argv[5], "msg") == 0;
  const int hold = argc == 7 && strcmp(argv[6], "hold") == 0 && !connected;
  const uint16_t port = (uint16_t)atoi(argv[2]);
  const uint16_t source_port = (uint16_t)atoi(argv[3]);
  const uint64_t cursor = strtoull(argv[4], NULL, 10);

  struct fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = connected ? FI_EP_MSG : FI_EP_RDM;
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | (connected ? FI_MSG | FI_SEND : 0);
  hints->mode = 0;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->cq_data_size = 4;
  hints->tx_attr->msg_order = FI_ORDER_WAW;
  hints->rx_attr->msg_order = FI_ORDER_WAW;
  hints->fabric_attr->prov_name = strdup(argv[1]);
  struct fi_info* info = NULL;
  int rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
  if (rc != 0) return fail("fi_getinfo", rc);
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_av* av = NULL;
  struct fid_cq* cq;
  struct fid_ep* ep = NULL;
  struct fid_eq* eq = NULL;
  struct fi_eq_attr eq_attr = {.size = 16, .wait_obj = FI_WAIT_UNSPEC};
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = 4};
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .size = 64};
  if ((rc = fi_fabric(info->fabric_attr, &fabric, NULL)) != 0) return fail("fi_fabric", rc);
  if ((rc = fi_domain(fabric, info, &domain, NULL)) != 0) return fail("fi_domain", rc);
  if ((rc = fi_cq_open(domain, &cq_attr, &cq, NULL)) != 0) return fail("fi_cq_open", rc);
  uint8_t address[64];
  size_t address_len = 0;
  if (connected) {
    if ((rc = fi_eq_open(fabric, &eq_attr, &eq, NULL)) != 0) return fail("fi_eq_open", rc);
  } else {
    if ((rc = fi_av_open(domain, &av_attr, &av, NULL)) != 0) return fail("fi_av_open", rc);
    if ((rc = fi_endpoint(domain, info, &ep, NULL)) != 0) return fail("fi_endpoint", rc);
    if ((rc = fi_ep_bind(ep, &av->fid, 0)) != 0 ||
        (rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0)
      return fail("fi_ep_bind", rc);
    if ((rc = fi_enable(ep)) != 0) return fail("fi_enable", rc);
    address_len = sizeof(address);
    if ((rc = fi_getname(&ep->fid, address, &address_len)) != 0) return fail("fi_getname", rc);
  }

  // REQ: magic, version 1, type 1, ring 2^20, our address; the 4-tuple; nonce; ring key,
  // ring address, note tag, notes' form (below).
  uint8_t req[MSG_BYTES] = {0};
  put_le(req, 0x53464c53, 4);
  req[4] = 1;
  req[5] = 1;
  req[6] = 20;
  req[7] = (uint8_t)address_len;
  put_le(req + 8, 0x5eed5eed5eed5eedull, 8);
  put_endpoint(req + 16, source_port);
  put_endpoint(req + 36, port);
  put_le(req + 56, 0x1111, 8);
  put_le(req + 64, 0, 8);
  put_le(req + 72, 0x000abc, 4);
  req[76] = 8;
  req[77] = connected ? 2 : 1;
  memcpy(req + 80, address, address_len);
  int udp = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval wait = {.tv_sec = 1};
  setsockopt(udp, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  connect(udp, (struct sockaddr*)&to, sizeof(to));
  // The listener refuses notes of another form than its own: ask in each (4: words, 8:
  // 8-byte notes, 30: cursor notes, 31: sends, connected endpoints only; sends name no
  // ring key).
  static const uint8_t forms[4] = {4, 8, 30, 31};
  uint8_t rep[MSG_BYTES + 1];
  ssize_t n = -1;
  for (int form = 0; form < (connected ? 4 : 2) && !(n == MSG_BYTES && rep[5] == 2); ++form) {
    req[76] = forms[form];
    put_le(req + 56, forms[form] == 31 ? 0 : 0x1111, 8);
    put_le(req + 8, 0x5eed5eed5eed5eedull + (uint64_t)form, 8);
    n = -1;
    for (int tries = 0; tries < 3 && n != MSG_BYTES; ++tries) {
      send(udp, req, sizeof(req), 0);
      n = recv(udp, rep, sizeof(rep), 0);
    }
  }
  if (n != MSG_BYTES || rep[5] != 2) {
    printf("{\"rep\": false, \"tag\": 0, \"notes\": 0}\n");
    close_fabric(ep, cq, eq, av, domain, fabric);
    return 0;
  }
  const uint64_t ring_key = get_le(rep + 56, 8);
  const uint64_t ring_addr = get_le(rep + 64, 8);
  const uint32_t tag = (uint32_t)get_le(rep + 72, 4);
  fi_addr_t listener = FI_ADDR_UNSPEC;
  const char* hijack = "none";
  long hijack_ms = -1;
  if (connected) {
    // The REP names the listener's connection listener (a sockaddr_in).
    struct sockaddr_in server;
    memcpy(&server, rep + 80, sizeof(server));
    if (server.sin_addr.s_addr == htonl(INADDR_ANY))
      server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timespec asked;
    clock_gettime(CLOCK_MONOTONIC, &asked);
    struct fid_ep* stolen = connect_ep(domain, info, cq, eq, &server, tag - 1, 0x0badc0de);
    hijack = stolen ? "accepted" : "refused";
    hijack_ms = elapsed_ms(&asked);
    if (stolen) fi_close(&stolen->fid);
    const uint64_t nonce = get_le(req + 8, 8);
    ep = connect_ep(domain, info, cq, eq, &server, tag, nonce);
    if (!ep) return fail("fi_connect", -1);
  } else if (fi_av_insert(av, rep + 80, 1, &listener, 0, NULL) != 1) {
    return fail("fi_av_insert", -1);
  }
  if (hold) {
    printf("{\"rep\": true, \"tag\": %u, \"nonce\": %llu, \"ring\": %u}\n", tag,
           (unsigned long long)get_le(req + 8, 8), 1u << rep[6]);
    fflush(stdout);
    for (int ms = 0; ms < HOLD_S * 1000; ++ms) {
      struct fi_cq_data_entry e[8];
      if (fi_cq_read(cq, e, 8) == -FI_EAVAIL) {
        struct fi_cq_err_entry err = {0};
        fi_cq_readerr(cq, &err, 0);
      }
      usleep(1000);
    }
    close_fabric(ep, cq, eq, av, domain, fabric);
    return 0;
  }

  int posted = 0, completed = 0;
  if (req[76] == 31) {
    // Messages: an empty data note, 16 bytes whose note claims CURSOR, an EOF at CURSOR.
    static char forged[16] = "FORGED BY A PEER";
    const uint64_t mask = (1ull << 30) - 1;
    const struct {
      size_t len;
      uint64_t note;
    } msgs[3] = {{0, cursor & mask}, {16, cursor & mask}, {0, 2ull << 30 | (cursor & mask)}};
    for (int i = 0; i < 3; ++i) {
      do {
        rc = (int)fi_senddata(ep, forged, msgs[i].len, NULL, msgs[i].note, 0, NULL);
        if (rc == -FI_EAGAIN) {
          struct fi_cq_data_entry e[8];
          if (fi_cq_read(cq, e, 8) > 0) ++completed;
        }
      } while (rc == -FI_EAGAIN);
      if (rc == 0) ++posted;
    }
  }
  for (uint32_t t = tag > 8 ? tag - 8 : 1; t < tag && req[76] != 31; ++t) {
    const uint64_t notes[3] = {
        (uint64_t)t << 40 | (uint64_t)1 << 36 | (cursor & ((1ull << 36) - 1)),  // 8 bytes
        (uint64_t)t << 8 | 1 << 4,                                              // 4 bytes
        cursor & ((1ull << 30) - 1),  // a data cursor note (kind 0 in bits 31..30)
    };
    for (int i = 0; i < (connected ? 3 : 2); ++i) {
      do {
        rc = (int)fi_writedata(ep, NULL, 0, NULL, notes[i], listener, ring_addr, ring_key, NULL);
        if (rc == -FI_EAGAIN) {
          struct fi_cq_data_entry e[8];
          if (fi_cq_read(cq, e, 8) > 0) ++completed;
        }
      } while (rc == -FI_EAGAIN);
      if (rc == 0) ++posted;
    }
  }
  // Completions (progress the provider so the writes go out).
  for (int spins = 0; spins < 2000 && completed < posted; ++spins) {
    struct fi_cq_data_entry e[8];
    const ssize_t got = fi_cq_read(cq, e, 8);
    if (got > 0) completed += (int)got;
    if (got == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      fi_cq_readerr(cq, &err, 0);
      ++completed;
    }
    usleep(1000);
  }
  printf(
      "{\"rep\": true, \"tag\": %u, \"posted\": %d, \"notes\": %d, \"hijack\": \"%s\", "
      "\"hijack_ms\": %ld}\n",
      tag, posted, completed, hijack, hijack_ms);
  fflush(stdout);
  close_fabric(ep, cq, eq, av, domain, fabric);
  fi_freeinfo(info);
  fi_freeinfo(hints);
  close(udp);
  return 0;
}
