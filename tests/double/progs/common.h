/* common.h -- helpers for the test programs of the cudasnap CUDA driver TEST DOUBLE. */
#ifndef DOUBLE_PROGS_COMMON_H
#define DOUBLE_PROGS_COMMON_H
#include <stdio.h>
#include <stdlib.h>
#include "cuda_double.h"

/* Module image understood by the double: names built-in host kernels. */
static const char MODULE_TEXT[] =
    "CUDADOUBLE\nkernel add_one\nkernel fill\nkernel saxpy\nkernel chase\nkernel incr\nkernel spin\n";

static long g_calls __attribute__((unused));  /* driver API calls made through CK */
static long g_launches __attribute__((unused));/* kernel launches made */

#define CK(x)                                                                               \
    do {                                                                                    \
        CUresult r_ = (x);                                                                  \
        g_calls++;                                                                          \
        if (r_ != CUDA_SUCCESS) {                                                           \
            fprintf(stderr, "%s:%d: %s failed: CUresult %d\n", __FILE__, __LINE__, #x, (int)r_); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define LAUNCH(x)      \
    do {               \
        CK(x);         \
        g_launches++;  \
    } while (0)

#endif
