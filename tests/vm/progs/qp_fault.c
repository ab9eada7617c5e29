// qp_fault: a fault injector for queue pairs, preloaded into a Slipstream process in the
// guest: it records every queue pair the process creates (ibv_create_qp), and once the
// file $QP_FAULT_FILE exists it moves each of them to the state $QP_FAULT_STATE (RESET,
// ERR; default RESET) behind the process's back, as a device or driver fault would. RESET
// is the silent one: no completion, no rdma_cm event, the queue pair simply stops.
//
// Built as a shared object; the test puts it in LD_PRELOAD next to libslipstream.so.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_QPS 256

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_qp* qps[MAX_QPS];
static int nqps;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct ibv_qp* (*real_create_qp)(struct ibv_pd*, struct ibv_qp_init_attr*);
static int (*real_destroy_qp)(struct ibv_qp*);

static void* watch(void* arg) {
  (void)arg;
  const char* file = getenv("QP_FAULT_FILE");
  const char* state = getenv("QP_FAULT_STATE");
  enum ibv_qp_state to = state && strcmp(state, "ERR") == 0 ? IBV_QPS_ERR : IBV_QPS_RESET;
  while (access(file, F_OK) != 0) usleep(10000);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nqps; ++i) {
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = to;
    int rc = ibv_modify_qp(qps[i], &attr, IBV_QP_STATE);
    fprintf(stderr, "qp_fault: queue pair %u to %s: %s\n", qps[i]->qp_num,
            to == IBV_QPS_ERR ? "ERR" : "RESET", rc == 0 ? "done" : strerror(rc));
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

static void init(void) {
  real_create_qp = dlvsym(RTLD_NEXT, "ibv_create_qp", "IBVERBS_1.1");
  real_destroy_qp = dlvsym(RTLD_NEXT, "ibv_destroy_qp", "IBVERBS_1.1");
  if (!getenv("QP_FAULT_FILE")) return;
  pthread_t thread;
  if (pthread_create(&thread, NULL, watch, NULL) == 0) pthread_detach(thread);
}

struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* attr) {
  pthread_once(&once, init);
  struct ibv_qp* qp = real_create_qp ? real_create_qp(pd, attr) : NULL;
  if (qp) {
    pthread_mutex_lock(&mu);
    if (nqps < MAX_QPS) qps[nqps++] = qp;
    pthread_mutex_unlock(&mu);
  }
  return qp;
}

int ibv_destroy_qp(struct ibv_qp* qp) {
  pthread_once(&once, init);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nqps; ++i) {
    if (qps[i] == qp) qps[i] = qps[--nqps];
  }
  pthread_mutex_unlock(&mu);
  return real_destroy_qp ? real_destroy_qp(qp) : -1;
}
