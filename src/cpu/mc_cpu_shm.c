/* mc_cpu_shm.c - the cpu transport's shared windows.
 *
 * A window is an anonymous memory file (memfd_create): it has no name in
 * /dev/shm, so a process killed at any point leaves nothing behind (the
 * memory goes with the last descriptor and mapping), and the size limit of
 * a container's /dev/shm does not apply. Every page is reserved at create
 * (posix_fallocate), after comparing the size with the memory this process
 * may still take (MemAvailable, and its memory cgroup's limit): touching an
 * unreserved page of a full shared-memory file kills the process with
 * SIGBUS, and reserving more than the cgroup allows invokes the OOM killer.
 *
 * Peers in other processes open the window through /proc/<pid>/fd/<fd>
 * while the owner still holds the descriptor (create's second allgather
 * says when every peer has mapped it; the owner closes it then). Before
 * mapping, a peer checks that the descriptor is the memory file the card
 * names (moecomm-<tag>-r<rank>, tag drawn at random by the owner), of the
 * announced size, and owned by this user: a descriptor that another
 * process put in its place, or a stranger's file, is refused.
 *
 * Ranks that are threads of one process use the owner's mapping as is. A
 * process-wide table counts the ranks using each mapping; the last one to
 * let go unmaps it, so a rank that destroys its handle early never pulls a
 * window from under a peer thread still writing into it. */
#include "mc_cpu_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mc_error.h"

/* A random number drawn once per process: two processes in different PID
 * namespaces can share a pid, never (pid, nonce). */
static uint64_t random64(void) {
  uint64_t r = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &r, sizeof r) != (ssize_t)sizeof r) r = 0;
    close(fd);
  }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  r ^= (uint64_t)getpid() << 32 ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)&ts;
  return r ? r : 1;
}
static uint64_t process_nonce(void) {
  static _Atomic uint64_t nonce;
  uint64_t v = atomic_load(&nonce);
  if (v) return v;
  uint64_t expected = 0;
  atomic_compare_exchange_strong(&nonce, &expected, random64()); /* the first thread's draw wins */
  return atomic_load(&nonce);
}

/* ---- the mappings of this process, counted ---- */
typedef struct mapping {
  struct mapping *next;
  void *addr;
  uint64_t bytes;
  int users;
} mapping_t;
static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static mapping_t *maps;

static int mapping_add(void *addr, uint64_t bytes) {
  mapping_t *m = malloc(sizeof *m);
  if (!m) return -1;
  *m = (mapping_t){NULL, addr, bytes, 1};
  pthread_mutex_lock(&maps_mu);
  m->next = maps;
  maps = m;
  pthread_mutex_unlock(&maps_mu);
  return 0;
}
/* Another rank of this process uses a mapping; 0 if it is not (or no longer) there. */
static int mapping_use(void *addr) {
  int found = 0;
  pthread_mutex_lock(&maps_mu);
  for (mapping_t *m = maps; m && !found; m = m->next)
    if (m->addr == addr && m->users > 0) m->users++, found = 1;
  pthread_mutex_unlock(&maps_mu);
  return found;
}

void mc_shm_release(void *addr) {
  if (!addr) return;
  mapping_t *gone = NULL;
  pthread_mutex_lock(&maps_mu);
  for (mapping_t **pm = &maps; *pm; pm = &(*pm)->next)
    if ((*pm)->addr == addr) {
      if (--(*pm)->users == 0) gone = *pm, *pm = gone->next;
      break;
    }
  pthread_mutex_unlock(&maps_mu);
  if (gone) {
    munmap(gone->addr, gone->bytes);
    free(gone);
  }
}

/* ---- how much shared memory this process may still take ---- */
static uint64_t read_u64_file(const char *path, int *ok) {
  char buf[64] = "";
  *ok = 0;
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  if (fgets(buf, sizeof buf, f)) *ok = buf[0] >= '0' && buf[0] <= '9';
  fclose(f);
  return *ok ? strtoull(buf, NULL, 10) : 0;
}
/* MemAvailable, lowered to what the memory cgroup (v2, or v1) still allows;
 * UINT64_MAX when neither can be read. */
static uint64_t memory_available(void) {
  uint64_t avail = UINT64_MAX;
  FILE *f = fopen("/proc/meminfo", "re");
  if (f) {
    char line[128];
    unsigned long long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (uint64_t)kb * 1024;
    fclose(f);
  }
  static const char *const limits[][2] = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                                          {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                           "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    int ok_limit, ok_used;
    uint64_t limit = read_u64_file(limits[i][0], &ok_limit), used = read_u64_file(limits[i][1], &ok_used);
    if (!ok_limit || !ok_used || limit >= (UINT64_C(1) << 60)) continue; /* "max", or no limit */
    uint64_t left = limit > used ? limit - used : 0;
    if (left < avail) avail = left;
  }
  return avail;
}

static void memfd_name(char *out, size_t n, uint64_t tag, int rank) {
  snprintf(out, n, "moecomm-%016" PRIx64 "-r%d", tag, rank);
}

/* A failure at create: the text on this rank, a shorter one for the peers. */
#define CREATE_FAIL(...)                                                                                               \
  do {                                                                                                                 \
    mc_fail(err, MC_ERR_SYSTEM, __VA_ARGS__);                                                                          \
    snprintf(card->why, sizeof card->why, "%.*s", (int)sizeof card->why - 1, err);                                     \
    if (fd >= 0) close(fd);                                                                                            \
    card->fd = -1;                                                                                                     \
    return MC_ERR_SYSTEM;                                                                                              \
  } while (0)

mc_result_t mc_shm_create(uint64_t bytes, int rank, mc_shm_card_t *card, void **addr, char *err) {
  memset(card, 0, sizeof *card);
  card->pid = (int64_t)getpid();
  card->nonce = process_nonce();
  card->tag = random64();
  card->rank = rank;
  card->fd = -1;
  *addr = NULL;
  int fd = -1;
  const uint64_t avail = memory_available();
  if (bytes > avail)
    CREATE_FAIL("rank %d: its window needs %" PRIu64 " bytes of shared memory, and %" PRIu64
                " are available to this process (MemAvailable and its memory cgroup's limit): "
                "lower max_tokens, or run fewer ranks per host",
                rank, bytes, avail);
  char name[64];
  memfd_name(name, sizeof name, card->tag, rank);
  fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) CREATE_FAIL("rank %d: memfd_create: %s", rank, strerror(errno));
  if (ftruncate(fd, (off_t)bytes) != 0)
    CREATE_FAIL("rank %d: sizing its %" PRIu64 "-byte window: %s", rank, bytes, strerror(errno));
  int e = posix_fallocate(fd, 0, (off_t)bytes); /* returns the error, errno untouched */
  if (e != 0)
    CREATE_FAIL("rank %d: cannot reserve its %" PRIu64 "-byte window in shared memory (%" PRIu64
                " bytes available): %s",
                rank, bytes, avail, strerror(e));
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) CREATE_FAIL("rank %d: cannot map its window: %s", rank, strerror(errno));
  if (mapping_add(p, bytes) != 0) {
    munmap(p, bytes);
    CREATE_FAIL("rank %d: out of host memory", rank);
  }
  card->fd = fd;
  card->addr = (uint64_t)(uintptr_t)p;
  *addr = p;
  return MC_SUCCESS;
}

mc_result_t mc_shm_open(const mc_shm_card_t *card, uint64_t bytes, void **addr, char *err) {
  *addr = NULL;
  if (card->pid == (int64_t)getpid() && card->nonce == process_nonce()) { /* a thread of this process */
    void *p = (void *)(uintptr_t)card->addr;
    if (!mapping_use(p))
      return mc_fail(err, MC_ERR_INTERNAL, "rank %d's window at %p is not mapped in this process", card->rank, p);
    *addr = p;
    return MC_SUCCESS;
  }
  /* the owner's descriptor, checked to be the memory file the card names */
  char path[64], target[128], want[96];
  snprintf(path, sizeof path, "/proc/%" PRId64 "/fd/%d", card->pid, (int)card->fd);
  memfd_name(want, sizeof want, card->tag, card->rank);
  ssize_t n = readlink(path, target, sizeof target - 1);
  target[n > 0 ? n : 0] = '\0';
  const size_t wl = strlen("/memfd:") + strlen(want);
  if (n <= 0 || strncmp(target, "/memfd:", 7) != 0 || strncmp(target + 7, want, strlen(want)) != 0 ||
      (target[wl] != '\0' && target[wl] != ' '))
    return mc_fail(err, MC_ERR_SYSTEM,
                   "cannot find rank %d's window (process %" PRId64 ", descriptor %d: %s): the rank "
                   "exited, or it runs in another PID namespace or container than this one",
                   card->rank, card->pid, (int)card->fd, n <= 0 ? strerror(errno) : "another file");
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return mc_fail(err, MC_ERR_SYSTEM, "cannot open rank %d's window (%s): %s", card->rank, path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (uint64_t)st.st_size != bytes) {
    close(fd);
    return mc_fail(err, MC_ERR_SYSTEM,
                   "rank %d's window is not the one this handle expects (owner uid %u, size %lld; "
                   "expected uid %u, %" PRIu64 " bytes)",
                   card->rank, (unsigned)st.st_uid, (long long)st.st_size, (unsigned)geteuid(), bytes);
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return mc_fail(err, MC_ERR_SYSTEM, "cannot map rank %d's window (%" PRIu64 " bytes): %s", card->rank, bytes,
                   strerror(errno));
  if (mapping_add(p, bytes) != 0) {
    munmap(p, bytes);
    return mc_fail(err, MC_ERR_SYSTEM, "out of host memory");
  }
  *addr = p;
  return MC_SUCCESS;
}

void mc_shm_close_fd(mc_shm_card_t *card) {
  if (card->fd >= 0) close(card->fd);
  card->fd = -1;
}
