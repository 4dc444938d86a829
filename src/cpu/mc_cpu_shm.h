/* mc_cpu_shm.h - the cpu transport's shared windows: made, reserved,
 * shared with peers and released (mc_cpu_shm.c says how and why). */
#ifndef MC_CPU_SHM_H
#define MC_CPU_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "moecomm.h"

/* What a window's owner tells its peers (through the allgather). A card
 * with addr 0 says the owner failed; why says how. */
typedef struct mc_shm_card {
  int64_t pid;    /* the owner's process */
  uint64_t nonce; /* with pid: "the same process", also across PID namespaces */
  uint64_t tag;   /* random per window: part of the name peers check */
  uint64_t addr;  /* the window in the owner's process (0: the owner failed) */
  int32_t fd;     /* the owner's descriptor of it, open until every peer has it mapped */
  int32_t rank;
  char why[112];  /* the owner's failure, for its peers' error texts */
} mc_shm_card_t;

/* Make this rank's window of `bytes`, with every page reserved now, so
 * that too little memory fails here and never later as SIGBUS. Fills card
 * (also on failure: addr 0 and why) and *addr. */
mc_result_t mc_shm_create(uint64_t bytes, int rank, mc_shm_card_t *card, void **addr, char *err);
/* Map a peer's window by its card: at the owner's address in the same
 * process, else through the owner's descriptor, after checking that it is
 * the window the card names and that this user owns it. */
mc_result_t mc_shm_open(const mc_shm_card_t *card, uint64_t bytes, void **addr, char *err);
/* The owner, once every peer has mapped its window: close the descriptor. */
void mc_shm_close_fd(mc_shm_card_t *card);
/* Let go of a window this rank made or opened: unmapped once no rank of
 * this process uses it any more (ranks that are threads share one mapping,
 * and a peer may still write into it after its owner let go). */
void mc_shm_release(void *addr);

#endif
