// forge_cm: sends a hand-made rdma_cm connection request to a Slipstream listener, the way
// a confused or hostile peer would, and reports what the listener did with it.
//
// usage: forge_cm HOST PORT MODE [CLIENT_PORT]
//   garbage   40 random bytes of private data          -> the listener must reject
//   short     a REQ cut to 10 bytes                    -> reject
//   version   a REQ with version 99                    -> reject
//   tuple     a well-formed REQ claiming another client address -> reject
//   nonce     a well-formed REQ for HOST:CLIENT_PORT -> HOST:PORT with a random nonce:
//             the listener accepts it (it cannot know yet), and must drop it once the TCP
//             connection from CLIENT_PORT turns out not to confirm that nonce
// Prints one line: "rejected", "established", then "disconnected" (nonce mode), or what
// happened instead. Exit 0 when the listener behaved as required.
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

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

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: forge_cm HOST PORT garbage|short|version|tuple|nonce [CLIENT_PORT]\n");
    return 2;
  }
  const char* mode = argv[3];
  struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
  if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1) return 2;
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* id = NULL;
  if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) != 0) {
    perror("rdma_create_id");
    return 3;
  }
  struct rdma_cm_event* ev = NULL;
  if (rdma_resolve_addr(id, NULL, (struct sockaddr*)&dst, 2000) != 0 ||
      !(ev = next_event(ch, 3000)) || ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
    fprintf(stderr, "resolve_addr failed\n");
    return 3;
  }
  rdma_ack_cm_event(ev);
  if (rdma_resolve_route(id, 2000) != 0 || !(ev = next_event(ch, 3000)) ||
      ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    fprintf(stderr, "resolve_route failed\n");
    return 3;
  }
  rdma_ack_cm_event(ev);
  struct ibv_qp_init_attr attr = {0};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, NULL, &attr) != 0) {
    perror("rdma_create_qp");
    return 3;
  }

  // The REQ layout of verbs/private_data.h (little-endian), built by hand on purpose.
  uint8_t pd[56] = {0};
  size_t len = 52;
  uint32_t magic = 0x51524c53;
  memcpy(pd, &magic, 4);
  pd[4] = 1;   // version
  pd[5] = 0;   // flags
  pd[6] = 20;  // ring 1 MiB
  pd[7] = 4;   // IPv4
  put16(pd + 8, (uint16_t)(argc > 4 ? atoi(argv[4]) : 40000));
  put16(pd + 10, (uint16_t)atoi(argv[2]));
  if (getrandom(pd + 12, 8, 0) != 8) return 3;
  memcpy(pd + 20, &dst.sin_addr, 4);  // client address: the host itself (one guest)
  memcpy(pd + 36, &dst.sin_addr, 4);
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
  } else if (strcmp(mode, "nonce") == 0) {
    expect_reject = 0;
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  struct rdma_conn_param param = {0};
  param.private_data = pd;
  param.private_data_len = (uint8_t)len;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_connect(id, &param) != 0) {
    perror("rdma_connect");
    return 3;
  }
  ev = next_event(ch, 10000);
  if (!ev) {
    printf("no answer\n");
    return 1;
  }
  enum rdma_cm_event_type got = ev->event;
  rdma_ack_cm_event(ev);
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
  ev = next_event(ch, 15000);
  if (!ev || ev->event != RDMA_CM_EVENT_DISCONNECTED) {
    printf("still connected\n");
    return 1;
  }
  rdma_ack_cm_event(ev);
  printf("disconnected\n");
  return 0;
}
