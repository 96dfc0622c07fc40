/* cuda.h for programs built against the cudasnap TEST DOUBLE (tests only): the double's
 * declarations under the name NVIDIA's header has, so code that includes <cuda.h> (the
 * programs `cudasnap export` writes) builds with -I tests/double/include. */
#include "../cuda_double.h"
