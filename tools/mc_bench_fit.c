/* mc_bench_fit.c - see mc_bench_fit.h. */
#include "mc_bench_fit.h"

#include <sys/wait.h>
#include <unistd.h>

#include "mc_ref_dev.h"

int mc_bench_gpu_fit(const mc_case_t *c, const mc_run_opts_t *o, int ranks_on_gpu, uint64_t free_bytes, char *why,
                     size_t n) {
  uint64_t library = 0;
  const uint64_t rank = mc_run_gpu_bytes(c, o, &library), all = rank * (uint64_t)ranks_on_gpu;
  if (all <= free_bytes) return 0;
  snprintf(why, n,
           "the GPU cannot hold this shape: a rank needs %llu bytes (%.1f GB: %.1f GB of expert_x, expert_scale and "
           "expert_y at %d experts x %d slots, out and inputs; %.1f GB of the library's), %d rank%s on GPU 0 need "
           "%llu, and %llu bytes (%.1f GB) are free",
           (unsigned long long)rank, (double)rank / 1e9, (double)(rank - library) / 1e9, mc_ref_local_experts(c),
           mc_ref_capacity(c), (double)library / 1e9, ranks_on_gpu, ranks_on_gpu == 1 ? "" : "s",
           (unsigned long long)all, (unsigned long long)free_bytes, (double)free_bytes / 1e9);
  return 2;
}

int mc_bench_gpu_check(const mc_case_t *c, const mc_run_opts_t *o, FILE *err) {
  if (o->transport != MC_TRANSPORT_NVSHMEM && o->transport != MC_TRANSPORT_P2P) return -1;
  struct {
    uint64_t free_bytes;
    int devices, ok;
  } got = {0, 0, 0};
  int fd[2];
  if (pipe(fd) != 0) return -1;
  fflush(NULL);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    got.ok = mc_dev_mem_info(&got.free_bytes, &got.devices) == 0;
    _exit(write(fd[1], &got, sizeof got) == (ssize_t)sizeof got ? 0 : 1);
  }
  close(fd[1]);
  const ssize_t r = pid > 0 ? read(fd[0], &got, sizeof got) : -1; /* one write under PIPE_BUF: whole or nothing */
  close(fd[0]);
  if (pid > 0) waitpid(pid, NULL, 0);
  if (r != (ssize_t)sizeof got || !got.ok) return -1;
  char why[512];
  if (mc_bench_gpu_fit(c, o, (c->world_size + got.devices - 1) / got.devices, got.free_bytes, why, sizeof why) == 0)
    return -1;
  fprintf(err, "mc-bench: %s\n", why);
  return 2;
}
