// forge_cm: a hostile rdma_cm peer of a Slipstream listener, as any other host on the
// fabric could be: hand-made connection requests, and RDMA WRITEs with what it learned.
// Reports what the listener did.
//
// usage: forge_cm HOST PORT MODE [CLIENT_PORT] [ARGS...]
//   garbage   40 random bytes of private data          -> the listener must reject
//   short     a REQ cut to 10 bytes                    -> reject
//   version   a REQ with version 99                    -> reject
//   tuple     a well-formed REQ claiming another client address -> reject
//   bigring   a well-formed REQ for 256 MiB rings (more than the listener's SLIP_RING_SIZE:
//             the listener decides what it pins)                 -> reject
//   nonce     a well-formed REQ for HOST:CLIENT_PORT -> HOST:PORT with a random nonce:
//             the listener accepts it (it cannot know yet), and must drop it once the TCP
//             connection from CLIENT_PORT turns out not to confirm that nonce
//   cross CLIENT_PORT GO_FILE SECONDS
//             a request from CLIENT_PORT, whose answer names the listener's ring (address
//             and key); the request is then abandoned (disconnected), so that its ring goes
//             back to the listener's pool; once GO_FILE exists (the test has started a
//             legitimate connection, which may get that ring), a second request of ours
//             (CLIENT_PORT + 1) is established and RDMA-WRITEs 64 KiB blocks of 0xA5 at the
//             learned address and key through its own queue pair for SECONDS. Prints
//             "refused STATUS" at the first write the listener's device refused (it must:
//             a queue pair reaches only its own connection's memory), or "wrote N" if all
//             landed (a hole: they went into another connection's stream).
//   committed CLIENT_PORT
//             as nonce, and then what a real client does before its SYN: a HELLO (SEND)
//             with the request's nonce and a ring of ours, so that the request looks
//             committed; then 4 KiB of 0xA5 RDMA-WRITTEN into the listener's ring (from
//             the REP) with a data note, as if they were stream bytes. Prints "committed
//             NONCE" (decimal),
//             then "disconnected" once the listener drops the request (within 20 s): the
//             TCP connection from CLIENT_PORT is a plain client, and none of this may reach
//             it or its server's application.
//   flood CLIENT_PORT COUNT HOLD_S
//             COUNT well-formed requests from this host (ports CLIENT_PORT and up), none
//             followed by its SYN, each kept open until the listener drops it, then all
//             abandoned HOLD_S seconds after the last. Prints "established E rejected R
//             most M" (M: the most the listener held at once), then after HOLD_S "dropped
//             D" (how many the listener had disconnected by then).
// Exit 0 when the run got to its report (the caller judges it) and, for the single-request
// modes, the listener behaved as required; 1 otherwise; 3 when the setup failed.
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static struct rdma_cm_event* next_event(struct rdma_event_channel* ch, int timeout_ms) {
  struct pollfd p = {ch->fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return NULL;
  struct rdma_cm_event* ev = NULL;
  return rdma_get_cm_event(ch, &ev) == 0 ? ev : NULL;
}

static void put16(uint8_t* p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

// One rdma_cm connection of ours: its own event channel, protection domain, queue pair.
struct peer {
  struct rdma_event_channel* ch;
  struct rdma_cm_id* id;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  uint8_t rep[64];  // the listener's answer (private data), once established
};

// Resolves `dst` and creates the queue pair. Returns 0, or -1 with a message printed.
static int peer_open(struct peer* p, const struct sockaddr_in* dst) {
  memset(p, 0, sizeof(*p));
  p->ch = rdma_create_event_channel();
  if (!p->ch || rdma_create_id(p->ch, &p->id, NULL, RDMA_PS_TCP) != 0) {
    perror("rdma_create_id");
    return -1;
  }
  struct rdma_cm_event* ev = NULL;
  if (rdma_resolve_addr(p->id, NULL, (struct sockaddr*)dst, 2000) != 0 ||
      !(ev = next_event(p->ch, 3000)) || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
    fprintf(stderr, "resolve_addr failed\n");
    return -1;
  }
  rdma_ack_cm_event(ev);
  if (rdma_resolve_route(p->id, 2000) != 0 || !(ev = next_event(p->ch, 3000)) ||
      ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    fprintf(stderr, "resolve_route failed\n");
    return -1;
  }
  rdma_ack_cm_event(ev);
  p->pd = ibv_alloc_pd(p->id->verbs);
  p->cq = p->pd ? ibv_create_cq(p->id->verbs, 16, NULL, NULL, 0) : NULL;
  struct ibv_qp_init_attr attr = {0};
  attr.send_cq = attr.recv_cq = p->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 8;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  if (!p->cq || rdma_create_qp(p->id, p->pd, &attr) != 0) {
    perror("rdma_create_qp");
    return -1;
  }
  return 0;
}

// The REQ layout of verbs/private_data.h (little-endian), built by hand on purpose: from
// this host's address (as rdma_cm resolved it) and `client_port` to `dst`.
static size_t build_req(uint8_t pd[56], const struct peer* p, const struct sockaddr_in* dst,
                        uint16_t client_port) {
  memset(pd, 0, 56);
  uint32_t magic = 0x51524c53;
  memcpy(pd, &magic, 4);
  pd[4] = 1;   // version
  pd[5] = 0;   // flags
  pd[6] = 20;  // ring 1 MiB
  pd[7] = 4;   // IPv4
  put16(pd + 8, client_port);
  put16(pd + 10, ntohs(dst->sin_port));
  if (getrandom(pd + 12, 8, 0) != 8) return 0;
  const struct sockaddr_in* src = (const struct sockaddr_in*)rdma_get_local_addr(p->id);
  memcpy(pd + 20, &src->sin_addr, 4);
  memcpy(pd + 36, &dst->sin_addr, 4);
  return 52;
}

// Sends the REQ; returns the event that answered it (ESTABLISHED keeps the REP in p->rep),
// or RDMA_CM_EVENT_TIMEWAIT_EXIT when nothing did.
static enum rdma_cm_event_type peer_request(struct peer* p, const uint8_t* pd, size_t len) {
  struct rdma_conn_param param = {0};
  param.private_data = pd;
  param.private_data_len = (uint8_t)len;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_connect(p->id, &param) != 0) {
    perror("rdma_connect");
    return RDMA_CM_EVENT_TIMEWAIT_EXIT;
  }
  struct rdma_cm_event* ev = next_event(p->ch, 10000);
  if (!ev) {
    fprintf(stderr, "no answer to the request in 10 s\n");
    return RDMA_CM_EVENT_TIMEWAIT_EXIT;
  }
  enum rdma_cm_event_type got = ev->event;
  if (got != RDMA_CM_EVENT_ESTABLISHED)
    fprintf(stderr, "the request got %s (status %d)\n", rdma_event_str(got), ev->status);
  if (got == RDMA_CM_EVENT_ESTABLISHED && ev->param.conn.private_data) {
    size_t n = ev->param.conn.private_data_len;
    memcpy(p->rep, ev->param.conn.private_data, n < sizeof(p->rep) ? n : sizeof(p->rep));
  }
  rdma_ack_cm_event(ev);
  return got;
}

static void peer_close(struct peer* p) {
  if (p->id) {
    rdma_disconnect(p->id);
    if (p->id->qp) rdma_destroy_qp(p->id);
    rdma_destroy_id(p->id);
  }
  if (p->cq) ibv_destroy_cq(p->cq);
  if (p->pd) ibv_dealloc_pd(p->pd);
  if (p->ch) rdma_destroy_event_channel(p->ch);
  memset(p, 0, sizeof(*p));
}

// cross: learn a ring's address and key, abandon that request, write there through
// another connection.
static int cross(const struct sockaddr_in* dst, uint16_t client_port, const char* go,
                 double seconds) {
  struct peer first, second;
  uint8_t pd[56];
  if (peer_open(&first, dst) != 0) return 3;
  size_t len = build_req(pd, &first, dst, client_port);
  if (peer_request(&first, pd, len) != RDMA_CM_EVENT_ESTABLISHED) {
    printf("first request not established\n");
    return 1;
  }
  uint64_t addr;
  uint32_t rkey;
  memcpy(&addr, first.rep + 16, 8);  // REP: ring address at 16, key at 24
  memcpy(&rkey, first.rep + 24, 4);
  const uint32_t ring = 1u << first.rep[6];
  printf("learned %#llx key %#x ring %u\n", (unsigned long long)addr, rkey, ring);
  fflush(stdout);
  peer_close(&first);  // abandoned: the listener gives its ring back to the pool
  for (double until = now_s() + 60; access(go, F_OK) != 0; usleep(20000)) {
    if (now_s() > until) {
      printf("no go\n");
      return 1;
    }
  }
  if (peer_open(&second, dst) != 0) return 3;
  len = build_req(pd, &second, dst, (uint16_t)(client_port + 1));
  if (peer_request(&second, pd, len) != RDMA_CM_EVENT_ESTABLISHED) {
    printf("second request not established\n");
    return 1;
  }
  static uint8_t block[64 << 10];
  memset(block, 0xa5, sizeof(block));
  struct ibv_mr* mr = ibv_reg_mr(second.pd, block, sizeof(block), IBV_ACCESS_LOCAL_WRITE);
  if (!mr) {
    perror("ibv_reg_mr");
    return 3;
  }
  long wrote = 0;
  for (double until = now_s() + seconds; now_s() < until;) {
    struct ibv_sge sge = {(uintptr_t)block, sizeof(block), mr->lkey};
    struct ibv_send_wr wr = {0}, *bad = NULL;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.rdma.remote_addr = addr + (uint64_t)(wrote * (long)sizeof(block)) % ring;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(second.id->qp, &wr, &bad) != 0) {
      printf("refused (post: %s)\n", strerror(errno));
      return 0;
    }
    struct ibv_wc wc;
    int n = 0;
    for (double limit = now_s() + 10; n == 0 && now_s() < limit;)
      n = ibv_poll_cq(second.cq, 1, &wc);
    if (n <= 0) {
      printf("refused (no completion)\n");
      return 0;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      printf("refused %s after %ld writes\n", ibv_wc_status_str(wc.status), wrote);
      return 0;
    }
    ++wrote;
  }
  printf("wrote %ld\n", wrote);
  return 0;
}

static void put32(uint8_t* p, uint32_t v) {
  put16(p, (uint16_t)v);
  put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(uint8_t* p, uint64_t v) {
  put32(p, (uint32_t)v);
  put32(p + 4, (uint32_t)(v >> 32));
}

// The listener drops our request (it must): prints "disconnected" and returns 0, or 1.
static int await_disconnect(struct peer* p, int timeout_ms) {
  struct rdma_cm_event* ev = next_event(p->ch, timeout_ms);
  if (!ev || ev->event != RDMA_CM_EVENT_DISCONNECTED) {
    printf("still connected\n");
    return 1;
  }
  rdma_ack_cm_event(ev);
  printf("disconnected\n");
  return 0;
}

// Posts one work request and waits for its completion; 0 when it succeeded.
static int post_and_wait(struct peer* p, struct ibv_send_wr* wr) {
  struct ibv_send_wr* bad = NULL;
  wr->send_flags |= IBV_SEND_SIGNALED;
  if (ibv_post_send(p->id->qp, wr, &bad) != 0) return -1;
  struct ibv_wc wc;
  int n = 0;
  for (double limit = now_s() + 10; n == 0 && now_s() < limit;) n = ibv_poll_cq(p->cq, 1, &wc);
  return n == 1 && wc.status == IBV_WC_SUCCESS ? 0 : -1;
}

// committed: a forged request that says HELLO and writes "stream bytes", as a real client.
static int committed(struct peer* p, const uint8_t* req) {
  uint64_t addr;
  uint32_t rkey;
  memcpy(&addr, p->rep + 16, 8);  // REP: ring address at 16, key at 24
  memcpy(&rkey, p->rep + 24, 4);
  static uint8_t ring[1 << 20];
  static uint8_t hello[28];
  static uint8_t block[4096];
  struct ibv_mr* mr = ibv_reg_mr(p->pd, ring, sizeof(ring),
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_mr* out = ibv_reg_mr(p->pd, hello, sizeof(hello), IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr* data = ibv_reg_mr(p->pd, block, sizeof(block), IBV_ACCESS_LOCAL_WRITE);
  if (!mr || !out || !data) {
    perror("ibv_reg_mr");
    return 3;
  }
  // verbs/private_data.h, Hello: magic "SLHL", version, ring log2, pad, nonce, ring, key.
  put32(hello, 0x4c484c53);
  hello[4] = 1;
  hello[5] = 20;
  memcpy(hello + 8, req + 12, 8);  // the request's nonce
  put64(hello + 16, (uint64_t)(uintptr_t)ring);
  put32(hello + 24, mr->rkey);
  struct ibv_sge sge = {(uintptr_t)hello, sizeof(hello), out->lkey};
  struct ibv_send_wr wr = {0};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (post_and_wait(p, &wr) != 0) {
    printf("hello not delivered\n");
    return 1;
  }
  memset(block, 0xa5, sizeof(block));
  struct ibv_sge dsge = {(uintptr_t)block, sizeof(block), data->lkey};
  struct ibv_send_wr dwr = {0};
  dwr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  dwr.imm_data = htonl(sizeof(block));  // a data note: produced = 4096
  dwr.sg_list = &dsge;
  dwr.num_sge = 1;
  dwr.wr.rdma.remote_addr = addr;
  dwr.wr.rdma.rkey = rkey;
  if (post_and_wait(p, &dwr) != 0) {
    printf("write not delivered\n");
    return 1;
  }
  uint64_t nonce;
  memcpy(&nonce, req + 12, 8);
  printf("committed %llu\n", (unsigned long long)nonce);
  fflush(stdout);
  return await_disconnect(p, 20000);
}

// Takes the events that arrived for p without waiting: 1 once the listener disconnected it.
static int peer_dropped(struct peer* p) {
  struct rdma_cm_event* ev;
  int dropped = 0;
  while ((ev = next_event(p->ch, 0)) != NULL) {
    dropped |= ev->event == RDMA_CM_EVENT_DISCONNECTED;
    rdma_ack_cm_event(ev);
  }
  return dropped;
}

// flood: COUNT requests, each held until the listener drops it.
static int flood(const struct sockaddr_in* dst, uint16_t client_port, int count, int hold_s) {
  struct peer* peers = calloc((size_t)count, sizeof(*peers));
  char* live = calloc((size_t)count, 1);
  if (!peers || !live) return 3;
  int established = 0, rejected = 0, held = 0, most = 0, dropped = 0;
  uint8_t pd[56];
  for (int i = 0; i < count; ++i) {
    if (peer_open(&peers[i], dst) != 0) return 3;
    size_t len = build_req(pd, &peers[i], dst, (uint16_t)(client_port + i));
    enum rdma_cm_event_type got = peer_request(&peers[i], pd, len);
    if (got == RDMA_CM_EVENT_ESTABLISHED) {
      ++established;
      live[i] = 1;
      ++held;
    } else if (got == RDMA_CM_EVENT_REJECTED) {
      ++rejected;
    } else {
      printf("request %d: %s\n", i, rdma_event_str(got));
      return 1;
    }
    // What the listener let go of before it answered this one (its disconnects were sent
    // first) is not held any more.
    for (int j = 0; j <= i; ++j) {
      if (live[j] && peer_dropped(&peers[j])) {
        live[j] = 0;
        --held;
        ++dropped;
      }
    }
    if (held > most) most = held;
  }
  printf("established %d rejected %d most %d\n", established, rejected, most);
  fflush(stdout);
  sleep((unsigned)hold_s);
  for (int j = 0; j < count; ++j) {
    if (live[j] && peer_dropped(&peers[j])) {
      live[j] = 0;
      ++dropped;
    }
  }
  printf("dropped %d\n", dropped);
  fflush(stdout);
  for (int i = 0; i < count; ++i) peer_close(&peers[i]);
  free(live);
  free(peers);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr,
            "usage: forge_cm HOST PORT garbage|short|version|tuple|bigring|nonce|committed "
            "[CLIENT_PORT]\n"
            "       forge_cm HOST PORT cross CLIENT_PORT GO_FILE SECONDS\n"
            "       forge_cm HOST PORT flood CLIENT_PORT COUNT HOLD_S\n");
    return 2;
  }
  const char* mode = argv[3];
  struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
  if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1) return 2;
  const uint16_t client_port = (uint16_t)(argc > 4 ? atoi(argv[4]) : 40000);
  if (strcmp(mode, "cross") == 0) {
    if (argc < 7) return 2;
    return cross(&dst, client_port, argv[5], atof(argv[6]));
  }
  if (strcmp(mode, "flood") == 0) {
    if (argc < 7) return 2;
    return flood(&dst, client_port, atoi(argv[5]), atoi(argv[6]));
  }

  struct peer p;
  if (peer_open(&p, &dst) != 0) return 3;
  uint8_t pd[56];
  size_t len = build_req(pd, &p, &dst, client_port);
  if (len == 0) return 3;
  int expect_reject = 1;
  if (strcmp(mode, "garbage") == 0) {
    if (getrandom(pd, 40, 0) != 40) return 3;
    len = 40;
  } else if (strcmp(mode, "short") == 0) {
    len = 10;
  } else if (strcmp(mode, "version") == 0) {
    pd[4] = 99;
  } else if (strcmp(mode, "tuple") == 0) {
    pd[23] ^= 0x55;  // another client address than the one the request comes from
  } else if (strcmp(mode, "bigring") == 0) {
    pd[6] = 28;
  } else if (strcmp(mode, "nonce") == 0 || strcmp(mode, "committed") == 0) {
    expect_reject = 0;
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  enum rdma_cm_event_type got = peer_request(&p, pd, len);
  if (got == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
    printf("no answer\n");
    return 1;
  }
  if (got == RDMA_CM_EVENT_REJECTED) {
    printf("rejected\n");
    return expect_reject ? 0 : 1;
  }
  if (got != RDMA_CM_EVENT_ESTABLISHED) {
    printf("event %s\n", rdma_event_str(got));
    return 1;
  }
  printf("established\n");
  fflush(stdout);
  if (expect_reject) return 1;
  if (strcmp(mode, "committed") == 0) return committed(&p, pd);
  return await_disconnect(&p, 15000);
}
