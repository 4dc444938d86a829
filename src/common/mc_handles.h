/* mc_handles.h - the handles alive in this process, so that destroying one
 * twice or using it after destroy is refused instead of touching freed
 * memory (a pointer reused by a later handle is the case this cannot tell). */
#ifndef MC_HANDLES_H
#define MC_HANDLES_H

int mc_handle_add(const void *h); /* 0, or -1 out of host memory */
void mc_handle_remove(const void *h);
int mc_handle_live(const void *h);

#endif
