/* The simulator adapter's interface (adapter.c): one declaration for the replay's cffi binding
   (driver.py reads this file as its cdef, leaving out lines that start with #) and for the
   program `export --sim` writes (program.c). */
#include <stddef.h>

int sim_load_ptx(const char *dir, const char *file);
void *sim_register(const char *name);
int sim_malloc(unsigned long long *p, size_t n);
int sim_free(unsigned long long p);
int sim_h2d(unsigned long long dst, const void *src, size_t n);
int sim_d2h(void *dst, unsigned long long src, size_t n);
int sim_d2d(unsigned long long dst, unsigned long long src, size_t n);
int sim_memset8(unsigned long long p, int v, size_t n);
int sim_sync(void);
int sim_globals(unsigned long long *out, int n);
int sim_launch(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
               unsigned shm, unsigned char *params, int nparams, const unsigned *offsets);
